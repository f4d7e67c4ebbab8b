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
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
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
// ErrTrailingData; or ErrTooDeep. Objects inside maps and interface values
// are checked for repeated keys too. A value whose type holds no keys
// (numbers, strings, booleans and lists of them) is skipped whole, and
// any other value whose shape does not fit its type is left alone: either
// is encoding/json's to refuse.
func Check(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // numbers are only skipped: never round them
	c := checker{dec: dec}
	if err := c.value(t, 0); err != nil {
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
	// path is where the value being checked is, built into a string only
	// for an error.
	path []step
	// skipped holds values skipped whole; reused to spare allocations.
	skipped json.RawMessage
}

// step is an object key, or an array index when key is "".
type step struct {
	key   string
	index int
}

func (c *checker) pathString() string {
	var b strings.Builder
	for _, s := range c.path {
		switch {
		case s.key == "":
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case b.Len() > 0:
			b.WriteString("." + s.key)
		default:
			b.WriteString(s.key)
		}
	}
	return b.String()
}

// eof is what the end of the data means: no document at all before the
// first token, a cut-off one after it (as encoding/json reports it).
func (c *checker) eof(err error) error {
	if err == io.EOF && c.started {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (c *checker) token() (json.Token, error) {
	tok, err := c.dec.Token()
	if err != nil {
		return nil, c.eof(err)
	}
	c.started = true
	return tok, nil
}

// value checks the next value, which will be decoded into a t (nil: a type
// that does not constrain keys).
func (c *checker) value(t reflect.Type, depth int) error {
	t = deref(t)
	if t != nil && keyless(t) {
		// Whatever is there holds no key to check: a value of another
		// shape is encoding/json's to refuse. One scan skips it whole.
		if err := c.dec.Decode(&c.skipped); err != nil {
			return c.eof(err)
		}
		c.started = true
		return nil
	}
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
	if delim == '[' {
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; c.dec.More(); i++ {
			c.path = append(c.path, step{index: i})
			if err := c.value(elem, depth+1); err != nil {
				return err
			}
			c.path = c.path[:len(c.path)-1]
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
	var seen map[string]bool // made for the second key: most objects are small
	var first string
	for n := 0; c.dec.More(); n++ {
		tok, err := c.token()
		if err != nil {
			return err
		}
		key, _ := tok.(string) // the decoder only returns strings as keys
		c.path = append(c.path, step{key: key})
		switch {
		case n == 0:
			first = key
		case seen == nil && key == first, seen[key]:
			return &KeyError{Path: c.pathString(), Duplicate: true}
		case seen == nil:
			seen = map[string]bool{first: true}
			fallthrough
		default:
			seen[key] = true
		}
		next := elem
		if fields != nil {
			ft, ok := fields[key]
			if !ok {
				return &KeyError{Path: c.pathString(), Suggest: foldMatch(fields, key)}
			}
			next = ft
		}
		if err := c.value(next, depth+1); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
	}
	_, err = c.token() // '}'
	return err
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// keyless reports whether no JSON value that decodes into a t can hold an
// object key: a number, string or boolean, or a list of them, decoded by
// encoding/json itself.
func keyless(t reflect.Type) bool {
	if t.Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(jsonUnmarshaler) ||
		t.Implements(textUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		return false
	}
	switch t.Kind() {
	case reflect.Bool, reflect.String, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return true
	case reflect.Slice, reflect.Array:
		return keyless(deref(t.Elem()))
	}
	return false
}

func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// fieldCache holds jsonFields' answers by type: a type's fields never
// change, and a document visits its types many times.
var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields maps the names encoding/json gives a struct's fields to their
// types. Embedded structs are not flattened: the request types have none,
// and a key meant for one is reported unknown rather than let through.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
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
	fieldCache.Store(t, fields)
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
