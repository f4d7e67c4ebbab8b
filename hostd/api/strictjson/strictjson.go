// Package strictjson checks a JSON document's object keys against the Go
// type it is about to be decoded into. encoding/json matches keys without
// regard to case ({"Web": true} sets the field tagged "web") and lets a
// repeated key silently replace the earlier value; in a request that grants
// permissions either can turn on what its author, or a proxy that read the
// document first, did not see. Check accepts a key only when it is spelled
// exactly as a field's json tag and appears at most once in its object, at
// every depth, so that encoding/json can then decode the document with
// nothing left to guess.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// MaxDepth bounds the nesting of objects and arrays: the check recurses
// once per level, and the documents it guards are a few levels deep.
const MaxDepth = 32

// ErrTrailingData means something follows the document's one value.
var ErrTrailingData = errors.New("strictjson: data after the top-level value")

// ErrTooDeep means the document nests deeper than MaxDepth.
var ErrTooDeep = fmt.Errorf("strictjson: nested deeper than %d levels", MaxDepth)

// KeyError is a key that the target type has no field for, or a key given
// twice in one object.
type KeyError struct {
	// Path names the key as the API names fields: "connections[0].name".
	Path string
	// Duplicate is true for a repeated key, false for an unknown one.
	Duplicate bool
	// Suggest is the field name that the key matches but for case, if any.
	Suggest string
}

func (e *KeyError) Error() string {
	if e.Duplicate {
		return fmt.Sprintf("strictjson: %s is given more than once", e.Path)
	}
	if e.Suggest != "" {
		return fmt.Sprintf("strictjson: unknown field %s (names are case-sensitive: did you mean %q?)", e.Path, e.Suggest)
	}
	return fmt.Sprintf("strictjson: unknown field %s", e.Path)
}

// Check reports the first key of data that encoding/json would not decode
// into a value of type t exactly as written, as a *KeyError; a syntax error
// (as encoding/json reports it, or io.EOF for no value at all);
// ErrTrailingData; or ErrTooDeep. Values whose type does not fit t are left
// for encoding/json to reject; objects inside them, and inside maps and
// interface values, are still checked for repeated keys.
func Check(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // numbers are only skipped: never round them
	c := checker{dec: dec}
	if err := c.value(t, "", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		if err != nil {
			return err
		}
		return ErrTrailingData
	}
	return nil
}

type checker struct {
	dec     *json.Decoder
	started bool
}

// token is the next token; the end of the data inside the document is
// io.ErrUnexpectedEOF, as encoding/json reports it.
func (c *checker) token() (json.Token, error) {
	tok, err := c.dec.Token()
	if err == io.EOF && c.started {
		return nil, io.ErrUnexpectedEOF
	}
	c.started = true
	return tok, err
}

// value checks the next value, which will be decoded into a t (nil: a type
// that does not constrain keys).
func (c *checker) value(t reflect.Type, path string, depth int) error {
	tok, err := c.token()
	if err != nil {
		return err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar
	}
	if depth >= MaxDepth {
		return ErrTooDeep
	}
	t = deref(t)
	if delim == '[' {
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; c.dec.More(); i++ {
			if err := c.value(elem, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
		_, err := c.token() // ']'
		return err
	}
	var fields map[string]reflect.Type
	var elem reflect.Type
	switch {
	case t == nil:
	case t.Kind() == reflect.Struct:
		fields = jsonFields(t)
	case t.Kind() == reflect.Map:
		elem = t.Elem()
	}
	seen := map[string]bool{}
	for c.dec.More() {
		tok, err := c.token()
		if err != nil {
			return err
		}
		key, _ := tok.(string) // the decoder only returns strings as keys
		keyPath := key
		if path != "" {
			keyPath = path + "." + key
		}
		if seen[key] {
			return &KeyError{Path: keyPath, Duplicate: true}
		}
		seen[key] = true
		next := elem
		if fields != nil {
			ft, ok := fields[key]
			if !ok {
				return &KeyError{Path: keyPath, Suggest: foldMatch(fields, key)}
			}
			next = ft
		}
		if err := c.value(next, keyPath, depth+1); err != nil {
			return err
		}
	}
	_, err = c.token() // '}'
	return err
}

func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// jsonFields maps the names encoding/json gives a struct's fields to their
// types. Embedded structs are not flattened: the request types have none,
// and a key meant for one is reported unknown rather than let through.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields
}

func foldMatch(fields map[string]reflect.Type, key string) string {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return name
		}
	}
	return ""
}
