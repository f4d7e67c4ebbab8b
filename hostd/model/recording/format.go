package recording

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

// A recording file is a JSON object with a version. Version 2 holds one
// entry per exchange whose request is a delta from the previous turn's;
// version 1 held every request whole. Both are read; a newer version is
// refused rather than misread.
const (
	fileVersion = 2
	// wholeRequestsVersion is the first format: every request whole.
	wholeRequestsVersion = 1
)

// Recording is a decoded recording file.
type Recording struct {
	// Exchanges are the recorded turns, each with its full request.
	Exchanges []Exchange
	// Truncated is set when the recording was cut at its size cap: the
	// turns after Exchanges were not stored.
	Truncated *Truncation
}

// Truncation marks a recording cut at its size cap. The turns after
// KeptTurns were made but not stored, so a replay stops there.
type Truncation struct {
	KeptTurns    int   `json:"kept_turns"`
	DroppedTurns int   `json:"dropped_turns"`
	DroppedBytes int64 `json:"dropped_bytes"`
	LimitBytes   int64 `json:"limit_bytes"`
}

// entry is one exchange as version 2 stores it.
type entry struct {
	Turn      int             `json:"turn"`
	Request   requestDelta    `json:"request"`
	Response  *model.Response `json:"response,omitempty"`
	Error     string          `json:"error,omitempty"`
	StartedAt time.Time       `json:"started_at"`
	Duration  time.Duration   `json:"duration_ns"`
}

// requestDelta is a request as its change from the previous turn's request
// (from an empty request on the first turn): the messages it keeps from
// the start of that request, the messages after them, and every other
// field only when it differs. A field set to its zero value is written
// (tools as []), so "unchanged" and "changed to nothing" stay apart.
type requestDelta struct {
	Model     *string       `json:"model,omitempty"`
	System    *string       `json:"system,omitempty"`
	Tools     *[]model.Tool `json:"tools,omitempty"`
	MaxTokens *int          `json:"max_tokens,omitempty"`
	// KeptMessages is how many messages of the previous request this
	// one starts with; Messages follow them.
	KeptMessages int             `json:"kept_messages"`
	Messages     []model.Message `json:"messages,omitempty"`
}

// deltaEncoder encodes a run's exchanges, given in turn order, as entries.
// It keeps the previous request, whose strings it shares with the caller.
type deltaEncoder struct {
	prev model.Request
}

func (d *deltaEncoder) encode(ex Exchange) ([]byte, error) {
	req, prev := ex.Request, d.prev
	delta := requestDelta{KeptMessages: keptMessages(prev.Messages, req.Messages)}
	delta.Messages = req.Messages[delta.KeptMessages:]
	if req.Model != prev.Model {
		delta.Model = &req.Model
	}
	if req.System != prev.System {
		delta.System = &req.System
	}
	if !sameTools(req.Tools, prev.Tools) {
		tools := req.Tools
		if tools == nil {
			tools = []model.Tool{}
		}
		delta.Tools = &tools
	}
	if req.MaxTokens != prev.MaxTokens {
		delta.MaxTokens = &req.MaxTokens
	}
	b, err := json.Marshal(entry{Turn: ex.Turn, Request: delta, Response: ex.Response, Error: ex.Error,
		StartedAt: ex.StartedAt, Duration: ex.Duration})
	if err != nil {
		return nil, fmt.Errorf("recording: encode turn %d: %w", ex.Turn, err)
	}
	d.prev = req
	return b, nil
}

// keptMessages is the length of the common start of two conversations.
// An agent only appends, so it is normally all of prev.
func keptMessages(prev, next []model.Message) int {
	n := 0
	for n < len(prev) && n < len(next) && sameMessage(prev[n], next[n]) {
		n++
	}
	return n
}

func sameMessage(a, b model.Message) bool {
	return a.Role == b.Role && a.Text == b.Text && slices.Equal(a.ToolCalls, b.ToolCalls) && slices.Equal(a.ToolResults, b.ToolResults)
}

func sameTools(a, b []model.Tool) bool {
	return slices.EqualFunc(a, b, func(x, y model.Tool) bool {
		return x.Name == y.Name && x.Description == y.Description && bytes.Equal(x.InputSchema, y.InputSchema)
	})
}

// decodeEntries rebuilds each turn's full request from version 2 entries.
// The rebuilt requests share their messages' strings.
func decodeEntries(entries []entry) ([]Exchange, error) {
	exchanges := make([]Exchange, 0, len(entries))
	var prev model.Request
	for i, e := range entries {
		d := e.Request
		if d.KeptMessages < 0 || d.KeptMessages > len(prev.Messages) {
			return nil, fmt.Errorf("recording: exchange %d keeps %d messages of a request that had %d", i, d.KeptMessages, len(prev.Messages))
		}
		req := prev
		req.Messages = append(slices.Clip(prev.Messages[:d.KeptMessages]), d.Messages...)
		if d.Model != nil {
			req.Model = *d.Model
		}
		if d.System != nil {
			req.System = *d.System
		}
		if d.Tools != nil {
			req.Tools = *d.Tools
			if len(req.Tools) == 0 {
				req.Tools = nil
			}
		}
		if d.MaxTokens != nil {
			req.MaxTokens = *d.MaxTokens
		}
		exchanges = append(exchanges, Exchange{Turn: e.Turn, Request: req, Response: e.Response, Error: e.Error,
			StartedAt: e.StartedAt, Duration: e.Duration})
		prev = req
	}
	return exchanges, nil
}

// WriteDocument writes a recording file from its stored parts: the
// entries a Writer handed its Sink, in turn order, and the JSON of its
// Truncation (nil when the recording is whole). The parts are written as
// they are: they must be what a Writer produced.
func WriteDocument(w io.Writer, entries [][]byte, truncated []byte) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "{\"version\": %d,\n", fileVersion)
	if len(truncated) > 0 {
		bw.WriteString(`"truncated": `)
		bw.Write(truncated)
		bw.WriteString(",\n")
	}
	bw.WriteString(`"exchanges": [`)
	for i, e := range entries {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.WriteByte('\n')
		bw.Write(e)
	}
	bw.WriteString("\n]}\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("recording: write document: %w", err)
	}
	return nil
}

// file is what every version has in common.
type file struct {
	Version   int             `json:"version"`
	Exchanges json.RawMessage `json:"exchanges"`
	Truncated *Truncation     `json:"truncated,omitempty"`
}

// Decode reads a recording file, of this version or version 1.
func Decode(r io.Reader) (Recording, error) {
	var f file
	if err := json.NewDecoder(r).Decode(&f); err != nil {
		return Recording{}, fmt.Errorf("recording: decode: %w", err)
	}
	if len(f.Exchanges) == 0 {
		return Recording{}, errors.New("recording: decode: no exchanges")
	}
	switch f.Version {
	case wholeRequestsVersion:
		var exchanges []Exchange
		if err := json.Unmarshal(f.Exchanges, &exchanges); err != nil {
			return Recording{}, fmt.Errorf("recording: decode version 1: %w", err)
		}
		return Recording{Exchanges: exchanges}, nil
	case fileVersion:
		var entries []entry
		if err := json.Unmarshal(f.Exchanges, &entries); err != nil {
			return Recording{}, fmt.Errorf("recording: decode: %w", err)
		}
		exchanges, err := decodeEntries(entries)
		if err != nil {
			return Recording{}, err
		}
		return Recording{Exchanges: exchanges, Truncated: f.Truncated}, nil
	}
	return Recording{}, fmt.Errorf("recording: version %d, want %d or %d", f.Version, fileVersion, wholeRequestsVersion)
}
