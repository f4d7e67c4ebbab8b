// Package recording captures the model exchanges of a run and replays them.
//
// Wrap puts a Recorder behind any provider: each Complete call is handed to
// the Recorder as an Exchange (request, response or error, timing) that
// marshals to JSON for storage with the run. Replay is a provider that
// serves a stored run's responses again, turn by turn and deterministically,
// while the tools they call really execute. Because tool output differs
// between runs (a random scratch path), Replay compares only the shape of
// each request (roles, tool call ids and names, which calls the results
// answer, the tools offered) and refuses a conversation that diverges.
package recording

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

// Exchange is one model call and its outcome.
type Exchange struct {
	// Turn numbers the calls of one run from 1.
	Turn     int             `json:"turn"`
	Request  model.Request   `json:"request"`
	Response *model.Response `json:"response,omitempty"`
	// Error is the call's failure; empty when Response is set.
	Error     string        `json:"error,omitempty"`
	StartedAt time.Time     `json:"started_at"`
	Duration  time.Duration `json:"duration_ns"`
}

// Recorder receives every exchange as it completes. Record must not keep
// the caller waiting long: it runs on the agent's path.
type Recorder interface {
	Record(Exchange)
}

// Wrap returns a provider that forwards to p and records every call with
// rec. Wrap once per run: turn numbers count that run's calls.
func Wrap(p model.Provider, rec Recorder) model.Provider {
	return &recorded{provider: p, recorder: rec}
}

type recorded struct {
	provider model.Provider
	recorder Recorder

	mu    sync.Mutex
	turns int
}

func (r *recorded) Complete(ctx context.Context, req model.Request) (model.Response, error) {
	r.mu.Lock()
	r.turns++
	turn := r.turns
	r.mu.Unlock()

	started := time.Now()
	resp, err := r.provider.Complete(ctx, req)
	ex := Exchange{Turn: turn, Request: cloneRequest(req), StartedAt: started.UTC(), Duration: time.Since(started)}
	if err != nil {
		ex.Error = err.Error()
	} else {
		ex.Response = ptr(cloneResponse(resp))
	}
	r.recorder.Record(ex)
	return resp, err
}

// Log is a Recorder that keeps exchanges in memory. It is safe for
// concurrent use.
type Log struct {
	mu        sync.Mutex
	exchanges []Exchange
}

// Record appends ex.
func (l *Log) Record(ex Exchange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exchanges = append(l.exchanges, ex)
}

// Exchanges returns what was recorded so far, in order.
func (l *Log) Exchanges() []Exchange {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.exchanges)
}

// file is the stored form of a recording; the version lets a later format
// refuse old files instead of misreading them.
type file struct {
	Version   int        `json:"version"`
	Exchanges []Exchange `json:"exchanges"`
}

const fileVersion = 1

// Encode writes exchanges as a recording file.
func Encode(w io.Writer, exchanges []Exchange) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(file{Version: fileVersion, Exchanges: exchanges}); err != nil {
		return fmt.Errorf("recording: encode: %w", err)
	}
	return nil
}

// Decode reads a recording file written by Encode.
func Decode(r io.Reader) ([]Exchange, error) {
	var f file
	if err := json.NewDecoder(r).Decode(&f); err != nil {
		return nil, fmt.Errorf("recording: decode: %w", err)
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("recording: version %d, want %d", f.Version, fileVersion)
	}
	return f.Exchanges, nil
}

func cloneRequest(req model.Request) model.Request {
	req.BeforeRetry = nil // a func is not data
	req.Messages = slices.Clone(req.Messages)
	for i := range req.Messages {
		m := &req.Messages[i]
		m.ToolCalls = slices.Clone(m.ToolCalls)
		m.ToolResults = slices.Clone(m.ToolResults)
	}
	req.Tools = slices.Clone(req.Tools)
	for i := range req.Tools {
		req.Tools[i].InputSchema = slices.Clone(req.Tools[i].InputSchema)
	}
	return req
}

func cloneResponse(resp model.Response) model.Response {
	resp.ToolCalls = slices.Clone(resp.ToolCalls)
	return resp
}

func ptr[T any](v T) *T { return &v }
