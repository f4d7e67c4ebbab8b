package strictjson

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

type grant struct {
	Name    *string  `json:"name"`
	Methods []string `json:"methods"`
}

type request struct {
	Prompt  *string           `json:"prompt"`
	Web     *bool             `json:"web"`
	Grants  []grant           `json:"connections"`
	Labels  map[string]string `json:"labels"`
	Extra   any               `json:"extra"`
	Ignored string            `json:"-"`
	Plain   int
}

func TestCheck(t *testing.T) {
	typ := reflect.TypeOf(&request{})
	for _, tt := range []struct {
		doc       string
		path      string // of the KeyError; "" when the document passes
		duplicate bool
		suggest   string
	}{
		{doc: `{"prompt":"p","web":true,"connections":[{"name":"a","methods":["GET"]}],"labels":{"a":"b"},"Plain":1}`},
		{doc: `{"\u0077eb":true}`}, // an escape spells the same key
		{doc: `null`},
		{doc: `{"web":"not a bool"}`}, // types are encoding/json's to check
		{doc: `{"connections":{"name":"a"}}`},
		// Where the type holds no keys, the value is skipped whole: an
		// object there is for encoding/json to refuse.
		{doc: `{"web":{"x":1,"x":2}}`},
		{doc: `{"connections":[{"methods":[{"x":1,"x":2}]}]}`},
		{doc: `{"Web":true}`, path: "Web", suggest: "web"},
		{doc: `{"WEB":true}`, path: "WEB", suggest: "web"},
		{doc: `{"plain":1}`, path: "plain", suggest: "Plain"},
		{doc: `{"Ignored":"x"}`, path: "Ignored"},
		{doc: `{"-":"x"}`, path: "-"},
		{doc: `{"web":false,"web":true}`, path: "web", duplicate: true},
		{doc: `{"prompt":"a","web":false,"prompt":"b"}`, path: "prompt", duplicate: true},
		{doc: `{"connections":[{"name":"a","methods":["GET"]},{"name":"b","Methods":["POST"]}]}`, path: "connections[1].Methods", suggest: "methods"},
		{doc: `{"connections":[{"name":"a","name":"b"}]}`, path: "connections[0].name", duplicate: true},
		{doc: `{"connections":[{"name":"a","token":"x"}]}`, path: "connections[0].token"},
		{doc: `{"labels":{"a":"1","a":"2"}}`, path: "labels.a", duplicate: true},
		{doc: `{"extra":[{"k":1,"k":2}]}`, path: "extra[0].k", duplicate: true},
		{doc: `[{"a":1},{"a":1,"a":2}]`, path: "[1].a", duplicate: true},
	} {
		err := Check([]byte(tt.doc), typ)
		if tt.path == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.doc, err)
			}
			continue
		}
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Path != tt.path || ke.Duplicate != tt.duplicate || ke.Suggest != tt.suggest {
			t.Errorf("%s: %#v (%v), want path %q duplicate %v suggest %q", tt.doc, ke, err, tt.path, tt.duplicate, tt.suggest)
		}
	}
}

func TestCheckRejectsWhatIsNotOneDocument(t *testing.T) {
	typ := reflect.TypeOf(&request{})
	var syntax *json.SyntaxError
	for doc, want := range map[string]func(error) bool{
		``:                func(err error) bool { return err == io.EOF },
		`{"web":true} {}`: func(err error) bool { return err == ErrTrailingData },
		`{"web":true} x`:  func(err error) bool { return errors.As(err, &syntax) },
		`{"web":tru}`:     func(err error) bool { return errors.As(err, &syntax) },
		`{"web":true`:     func(err error) bool { return err == io.ErrUnexpectedEOF },
		`{"web" true}`:    func(err error) bool { return errors.As(err, &syntax) },
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1):               func(err error) bool { return err == ErrTooDeep },
		strings.Repeat(`{"extra":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1): func(err error) bool { return err == ErrTooDeep },
	} {
		if err := Check([]byte(doc), typ); !want(err) {
			t.Errorf("%.60s: %v", doc, err)
		}
	}
	if err := Check([]byte(strings.Repeat("[", MaxDepth)+strings.Repeat("]", MaxDepth)), typ); err != nil {
		t.Errorf("%d levels: %v", MaxDepth, err)
	}
}
