package example

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/ephemeralhq/ephemeral/examples"
)

func TestTheShippedExamplesLoad(t *testing.T) {
	set, err := Load(examples.Files)
	if err != nil {
		t.Fatal(err)
	}
	all := set.All()
	if all[0].Name != "product-page" {
		t.Errorf("first example %q, want the product page's", all[0].Name)
	}
	for _, e := range all {
		if e.Model() == "" || e.Title["de"] == "" || e.Summary["de"] == "" || e.HowItWorks["de"] == "" {
			t.Errorf("%s: model %q, or a German text missing", e.Name, e.Model())
		}
		r, err := e.NewReplay()
		if err != nil || r.Model() != e.Model() || r.Remaining() == 0 {
			t.Errorf("%s: replay %v, %v", e.Name, r, err)
		}
	}
	if _, ok := set.Get("no-such"); ok {
		t.Error("found an example that does not exist")
	}
}

func TestParseRefusesBrokenDocuments(t *testing.T) {
	good, err := examples.Files.ReadFile("product-page.json")
	if err != nil {
		t.Fatal(err)
	}
	if !IsExample(good) {
		t.Fatal("the product page's document is not recognised")
	}
	if IsExample([]byte(`{"version":1,"exchanges":[]}`)) {
		t.Error("a bare recording is taken for an example")
	}
	var doc map[string]any
	json.Unmarshal(good, &doc)
	for name, mutate := range map[string]func(map[string]any){
		"unknown member": func(d map[string]any) { d["colour"] = "red" },
		"other format":   func(d map[string]any) { d["format"] = "ephemeral-example/9" },
		"bad name":       func(d map[string]any) { d["name"] = "../etc" },
		"no English":     func(d map[string]any) { d["title"] = map[string]string{"de": "nur Deutsch"} },
		"no recording":   func(d map[string]any) { delete(d, "recording") },
		"bad recording":  func(d map[string]any) { d["recording"] = map[string]any{"version": 99} },
	} {
		m := map[string]any{}
		for k, v := range doc {
			m[k] = v
		}
		mutate(m)
		b, _ := json.Marshal(m)
		if _, err := Parse(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	renamed := fstest.MapFS{"other-name.json": {Data: good}}
	if _, err := Load(renamed); err == nil || !strings.Contains(err.Error(), "named after it") {
		t.Errorf("a file not named after its example: %v", err)
	}
}
