package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// Recorder is an Executor's only way to write a run's timeline and its
// recording and to spend its budget. Its writes do not take the run's
// context: a run being stopped must still be able to record what it
// already spent.
type Recorder struct {
	svc           *Service
	runID         string
	queuedAt      time.Time
	zeroRetention bool
	meter         *ledger.Meter

	mu   sync.Mutex
	stop context.CancelCauseFunc
}

// recordTimeout bounds each database write the Recorder makes.
const recordTimeout = 10 * time.Second

// Withheld replaces user content in the timeline of a zero-data-retention run.
const Withheld = "[withheld: zero data retention]"

func (r *Recorder) setStop(stop context.CancelCauseFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stop = stop
}

// Event appends a timeline entry whose message and data are the system's own
// words (e.g. timeline.MicroVMReady), never user content.
func (r *Recorder) Event(category, message string, data map[string]any) error {
	return r.append(store.Event{Category: category, Message: message, Data: mustJSON(data)})
}

// ContentEvent appends an entry that carries user content, such as a shell
// command and its output. Under zero data retention the message is withheld
// and only the numbers and flags in data are kept; otherwise the entry is
// purged with the run's content when its retention ends.
func (r *Recorder) ContentEvent(category, message string, data map[string]any) error {
	return r.ContentEventAt(time.Now(), category, message, data)
}

// ContentEventAt is ContentEvent for something that started at, earlier:
// a command's entry carries its result but is placed at its start, so the
// parallel commands of one model turn share their t.
func (r *Recorder) ContentEventAt(at time.Time, category, message string, data map[string]any) error {
	_, err := r.StartContentEvent(at, category, message, data)
	return err
}

// StartContentEvent appends a content entry for something that started at
// and is still going, and returns its sequence number for
// AmendContentEvent: live readers see it at once and see it again when
// amended.
func (r *Recorder) StartContentEvent(at time.Time, category, message string, data map[string]any) (seq int64, err error) {
	if r.zeroRetention {
		message = Withheld
	}
	e, err := r.appendAt(at, store.Event{Category: category, Message: message, Data: mustJSON(r.retained(data)), Content: true})
	return e.Seq, err
}

// AmendContentEvent replaces the data of the run's entry seq, appended by
// StartContentEvent, with data under the same rules: under zero data
// retention only numbers, flags and timeline.State values are kept, and the
// entry is purged with the run's content.
func (r *Recorder) AmendContentEvent(seq int64, data map[string]any) error {
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	if _, err := r.svc.store.AmendEventData(ctx, r.runID, seq, mustJSON(r.retained(data)), true); err != nil {
		return err
	}
	r.svc.hub.Notify(r.runID)
	return nil
}

// retained is what of a content entry's data may be stored: everything,
// or under zero data retention only the values that cannot carry user
// content.
func (r *Recorder) retained(data map[string]any) map[string]any {
	if !r.zeroRetention {
		return data
	}
	kept := map[string]any{}
	for k, v := range data {
		switch v.(type) {
		case bool, int, int32, int64, uint, uint32, uint64, float32, float64, time.Duration, timeline.State:
			kept[k] = v
		}
	}
	return kept
}

func (r *Recorder) append(e store.Event) error {
	_, err := r.appendAt(time.Now(), e)
	return err
}

func (r *Recorder) appendAt(at time.Time, e store.Event) (store.Event, error) {
	e.T = at.Sub(r.queuedAt)
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	e, err := r.svc.store.AppendEvent(ctx, r.runID, e)
	if err != nil {
		return store.Event{}, err
	}
	r.svc.hub.Notify(r.runID)
	return e, nil
}

// Charge meters usage against the run's budget and persists the total so a
// crash cannot lose it. When the charge reaches the limit it returns an error
// matching ledger.ErrBudgetExceeded and stops the run (its context ends);
// the cost recorded never exceeds the limit.
func (r *Recorder) Charge(u ledger.Usage) error {
	usage, cost, meterErr := r.meter.Charge(u)
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	persistErr := r.svc.store.RecordUsage(ctx, r.runID, usage, cost)
	if meterErr != nil {
		r.mu.Lock()
		if r.stop != nil {
			r.stop(errBudget)
		}
		r.mu.Unlock()
	}
	return errors.Join(meterErr, persistErr)
}

// SaveRecording stores the run's model exchanges with the run, where they
// are purged with the rest of its content; call it before Execute returns.
// Under zero data retention it stores nothing.
func (r *Recorder) SaveRecording(exchanges []recording.Exchange) error {
	if r.zeroRetention || len(exchanges) == 0 {
		return nil
	}
	var doc bytes.Buffer
	if err := recording.Encode(&doc, exchanges); err != nil {
		return fmt.Errorf("runs: save recording of %s: %w", r.runID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	return r.svc.store.SaveRecording(ctx, r.runID, doc.Bytes())
}

// Remaining is what the run may still spend, in micros: check it before
// starting something that costs money.
func (r *Recorder) Remaining() int64 { return r.meter.Remaining() }

// BootDuration reports how long the run's microVM took to become ready.
func (r *Recorder) BootDuration(d time.Duration) { r.svc.BootDurations.Observe(d) }

func mustJSON(v map[string]any) json.RawMessage {
	if len(v) == 0 {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		// Only an Executor passing an unencodable value gets here; record
		// that instead of losing the event.
		b, _ = json.Marshal(map[string]string{"data_error": err.Error()})
	}
	return b
}
