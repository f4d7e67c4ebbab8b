// Package example reads the shipped examples (see package examples): runs
// recorded with everything the web app shows of them. An example document
// is JSON:
//
//	{
//	  "format": "ephemeral-example/1",
//	  "name": "product-page", "order": 1,
//	  "title":        {"en": "...", "de": "..."},
//	  "summary":      {"en": "...", "de": "..."},
//	  "how_it_works": {"en": "...", "de": "..."},
//	  "request":   { request.json, as POST /v1/runs takes it },
//	  "run":       { the finished run, as GET /v1/runs/{id} returns it },
//	  "events":    [ its timeline, as GET /v1/runs/{id}/events returns it ],
//	  "recording": { its model exchanges, as GET /v1/runs/{id}/recording returns it }
//	}
//
// The recording is kept as an opaque document for package recording, which
// replays the model's turns while the commands run live again.
package example

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
)

// Format is the value of an example document's "format" member.
const Format = "ephemeral-example/1"

// Text is one text in several languages, by language code; "en" is
// always there.
type Text map[string]string

// In is the text in lang, else in English.
func (t Text) In(lang string) string {
	if s, ok := t[lang]; ok && s != "" {
		return s
	}
	return t["en"]
}

// Example is one shipped example.
type Example struct {
	Format     string          `json:"format"`
	Name       string          `json:"name"`
	Order      int             `json:"order"`
	Title      Text            `json:"title"`
	Summary    Text            `json:"summary"`
	HowItWorks Text            `json:"how_it_works"`
	Request    json.RawMessage `json:"request"`
	Run        json.RawMessage `json:"run"`
	Events     json.RawMessage `json:"events"`
	Recording  json.RawMessage `json:"recording"`
}

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// IsExample reports whether data is an example document rather than, say,
// a bare recording.
func IsExample(data []byte) bool {
	var probe struct {
		Format string `json:"format"`
	}
	return json.Unmarshal(data, &probe) == nil && strings.HasPrefix(probe.Format, "ephemeral-example/")
}

// Parse reads and checks one example document.
func Parse(data []byte) (Example, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var e Example
	if err := dec.Decode(&e); err != nil {
		return Example{}, fmt.Errorf("example: %w", err)
	}
	switch {
	case e.Format != Format:
		return Example{}, fmt.Errorf("example %q: format %q, want %q", e.Name, e.Format, Format)
	case !namePattern.MatchString(e.Name):
		return Example{}, fmt.Errorf("example %q: name must match %s", e.Name, namePattern)
	case e.Title["en"] == "" || e.Summary["en"] == "" || e.HowItWorks["en"] == "":
		return Example{}, fmt.Errorf("example %s: title, summary and how_it_works need English", e.Name)
	case len(e.Request) == 0 || len(e.Run) == 0 || len(e.Events) == 0 || len(e.Recording) == 0:
		return Example{}, fmt.Errorf("example %s: request, run, events and recording are required", e.Name)
	}
	rec, err := e.decodeRecording()
	if err != nil {
		return Example{}, fmt.Errorf("example %s: %w", e.Name, err)
	}
	if rec.Truncated != nil {
		return Example{}, fmt.Errorf("example %s: its recording was cut at its size cap: it cannot be replayed", e.Name)
	}
	return e, nil
}

func (e Example) decodeRecording() (recording.Recording, error) {
	return recording.Decode(bytes.NewReader(e.Recording))
}

// NewReplay returns a fresh provider replaying the example's model turns:
// one per run, since a replay serves each turn once.
func (e Example) NewReplay() (*recording.Replay, error) {
	rec, err := e.decodeRecording()
	if err != nil {
		return nil, err
	}
	return recording.NewReplay(rec)
}

// Model is the model the example's run used.
func (e Example) Model() string {
	var run struct {
		Model string `json:"model"`
	}
	json.Unmarshal(e.Run, &run) // Parse checked the document decodes
	return run.Model
}

// Set is the examples by name, in their order.
type Set struct {
	list []Example
}

// Load reads every *.json document of fsys as an example.
func Load(fsys fs.FS) (*Set, error) {
	names, err := fs.Glob(fsys, "*.json")
	if err != nil {
		return nil, fmt.Errorf("example: %w", err)
	}
	s := &Set{}
	for _, name := range names {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("example: %w", err)
		}
		e, err := Parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if e.Name != strings.TrimSuffix(path.Base(name), ".json") {
			return nil, fmt.Errorf("%s: example named %q: the file must be named after it", name, e.Name)
		}
		s.list = append(s.list, e)
	}
	if len(s.list) == 0 {
		return nil, errors.New("example: no examples")
	}
	slices.SortStableFunc(s.list, func(a, b Example) int { return a.Order - b.Order })
	return s, nil
}

// All lists the examples in their order.
func (s *Set) All() []Example { return slices.Clone(s.list) }

// Get finds an example by name.
func (s *Set) Get(name string) (Example, bool) {
	for _, e := range s.list {
		if e.Name == name {
			return e, true
		}
	}
	return Example{}, false
}
