package recording

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

// Replay errors.
var (
	// ErrDiverged means a request's shape differs from the recorded
	// request of the same turn.
	ErrDiverged = errors.New("replay: conversation diverged from the recording")
	// ErrExhausted means the run asked for more turns than were recorded.
	ErrExhausted = errors.New("replay: no recorded turn left")
	// ErrRecordedFailure is returned for a turn whose recorded call
	// failed, so a replay fails where the original did.
	ErrRecordedFailure = errors.New("replay: the recorded call failed")
	// ErrTruncated means the run asked for a turn the recording made but
	// did not store: it was cut at its size cap.
	ErrTruncated = errors.New("replay: the recording was cut at its size cap")
)

// Replay serves recorded responses in order. It is a model.Provider for one
// run; it is safe for concurrent use, though a run calls it turn by turn.
type Replay struct {
	mu        sync.Mutex
	exchanges []Exchange
	truncated *Truncation
	next      int
}

// NewReplay checks that the recording's exchanges form a run (turns 1..n,
// each with a response or an error) and returns a provider that replays
// it. A truncated recording replays up to its cut.
func NewReplay(rec Recording) (*Replay, error) {
	exchanges := rec.Exchanges
	if len(exchanges) == 0 {
		if rec.Truncated != nil {
			return nil, fmt.Errorf("%w of %d bytes before its first turn: nothing can be replayed", ErrTruncated, rec.Truncated.LimitBytes)
		}
		return nil, errors.New("replay: recording has no exchanges")
	}
	for i, ex := range exchanges {
		if ex.Turn != i+1 {
			return nil, fmt.Errorf("replay: exchange %d has turn %d, want %d", i, ex.Turn, i+1)
		}
		if (ex.Response == nil) == (ex.Error == "") {
			return nil, fmt.Errorf("replay: turn %d needs exactly one of response and error", ex.Turn)
		}
	}
	if t := rec.Truncated; t != nil && t.KeptTurns != len(exchanges) {
		return nil, fmt.Errorf("replay: the recording holds %d turns but says it was cut after turn %d", len(exchanges), t.KeptTurns)
	}
	r := &Replay{exchanges: slices.Clone(exchanges)}
	if rec.Truncated != nil {
		r.truncated = ptr(*rec.Truncated)
	}
	return r, nil
}

// Truncated reports where the recording was cut at its size cap, if it
// was: a replay fails with ErrTruncated at the first turn it does not hold.
func (r *Replay) Truncated() (Truncation, bool) {
	if r.truncated == nil {
		return Truncation{}, false
	}
	return *r.truncated, true
}

// Model is the model the recorded run asked for.
func (r *Replay) Model() string { return r.exchanges[0].Request.Model }

// Complete returns the next recorded response after checking that req has
// the shape of the request recorded for that turn. A diverging request does
// not use up the turn.
func (r *Replay) Complete(ctx context.Context, req model.Request) (model.Response, error) {
	if err := ctx.Err(); err != nil {
		return model.Response{}, fmt.Errorf("replay: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next >= len(r.exchanges) {
		if t := r.truncated; t != nil {
			return model.Response{}, fmt.Errorf("turn %d: %w of %d bytes after turn %d: the run's %d later turns were not stored and cannot be replayed",
				r.next+1, ErrTruncated, t.LimitBytes, t.KeptTurns, t.DroppedTurns)
		}
		return model.Response{}, fmt.Errorf("replay: turn %d of %d: %w", r.next+1, len(r.exchanges), ErrExhausted)
	}
	ex := r.exchanges[r.next]
	if err := sameShape(ex.Request, req); err != nil {
		return model.Response{}, fmt.Errorf("turn %d: %w: %w", ex.Turn, ErrDiverged, err)
	}
	r.next++
	if ex.Response == nil {
		return model.Response{}, fmt.Errorf("turn %d: %w: %s", ex.Turn, ErrRecordedFailure, ex.Error)
	}
	return cloneResponse(*ex.Response), nil
}

// Remaining is the number of recorded turns not yet served.
func (r *Replay) Remaining() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.exchanges) - r.next
}

// sameShape compares what the model saw structurally, ignoring text, which
// legitimately differs between the recorded run and its replay.
func sameShape(recorded, got model.Request) error {
	if want, have := toolNames(recorded), toolNames(got); want != have {
		return fmt.Errorf("tools offered are [%s], recorded [%s]", have, want)
	}
	if len(got.Messages) != len(recorded.Messages) {
		return fmt.Errorf("%d messages, recorded %d", len(got.Messages), len(recorded.Messages))
	}
	for i := range recorded.Messages {
		if want, have := messageShape(recorded.Messages[i]), messageShape(got.Messages[i]); want != have {
			return fmt.Errorf("message %d is %s, recorded %s", i, have, want)
		}
	}
	return nil
}

func toolNames(req model.Request) string {
	names := make([]string, 0, len(req.Tools))
	for _, t := range req.Tools {
		names = append(names, t.Name)
	}
	slices.Sort(names)
	return strings.Join(names, " ")
}

// messageShape renders the structural part of a message, e.g.
// "assistant calls [c1:shell c2:shell]" or "tool results for [c1 c2]".
func messageShape(m model.Message) string {
	var b strings.Builder
	b.WriteString(string(m.Role))
	if len(m.ToolCalls) > 0 {
		b.WriteString(" calls [")
		for i, c := range m.ToolCalls {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%q:%q", c.ID, c.Name)
		}
		b.WriteByte(']')
	}
	if len(m.ToolResults) > 0 {
		// Parallel calls may finish in any order; which calls are
		// answered matters, not the order of the answers.
		ids := make([]string, 0, len(m.ToolResults))
		for _, r := range m.ToolResults {
			ids = append(ids, fmt.Sprintf("%q", r.CallID))
		}
		slices.Sort(ids)
		fmt.Fprintf(&b, " results for [%s]", strings.Join(ids, " "))
	}
	return b.String()
}
