// Package recording captures the model exchanges of a run and replays them.
//
// Wrap puts a Recorder behind any provider: each Complete call is handed to
// the Recorder as an Exchange (request, response or error, timing). A run
// records with a Writer, which stores each exchange as it completes, through
// a Sink (the run's store), as an entry holding only what changed since the
// previous request: every request repeats the whole conversation so far, so
// storing requests whole would grow with the square of the turns. The
// Writer stops storing at a size cap and marks the recording truncated.
//
// WriteDocument joins stored entries into a recording file; Decode reads
// one (this version's, and version 1's, which held every request whole)
// and rebuilds each turn's full request. Replay is a provider that serves a
// recording's responses again, turn by turn and deterministically, while
// the tools they call really execute. Because tool output differs between
// runs (a random scratch path), Replay compares only the shape of each
// request (roles, tool call ids and names, which calls the results answer,
// the tools offered) and refuses a conversation that diverges.
package recording

import (
	"context"
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

// Recorder receives every exchange as it completes, in turn order. Record
// runs on the agent's path: it must not keep the caller waiting long.
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

// cloneRequest copies what a caller may change in place after the call
// (the slices); the strings, the bulk of a conversation, are shared.
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
