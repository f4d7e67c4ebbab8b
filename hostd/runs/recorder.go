package runs

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/outputs"
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
	recording     *recording.Writer
	timeline      *timelineCap

	// clock bounds the run in time; set before the Executor runs.
	clock *runClock

	mu   sync.Mutex
	stop context.CancelCauseFunc
	// files are a zero-data-retention run's outputs, held until the run
	// ends and they move to the service's volatile outputs.
	files []store.Output
}

func newRecorder(s *Service, spec Spec, queuedAt time.Time) *Recorder {
	r := &Recorder{
		svc: s, runID: spec.RunID, queuedAt: queuedAt, zeroRetention: spec.ZeroDataRetention,
		meter:    ledger.NewMeter(s.cfg.Rates, spec.MaxCostMicros),
		timeline: &timelineCap{limit: s.cfg.MaxTimelineBytes},
	}
	r.recording = recording.NewWriter(recordingSink{r}, s.cfg.MaxRecordingBytes)
	return r
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
// words (e.g. timeline.MicroVMReady), never user content. Such entries are
// few per run: they are stored even past the timeline's cap.
func (r *Recorder) Event(category, message string, data map[string]any) error {
	e := store.Event{Category: category, Message: message, Data: mustJSON(data)}
	r.timeline.charge(entrySize(e))
	return r.append(e)
}

// ContentEvent appends an entry that carries user content, such as a shell
// command and its output. Under zero data retention the message is withheld
// and only the numbers and flags in data are kept; otherwise the entry is
// purged with the run's content when its retention ends. An entry that
// would take the run's timeline past its cap is not stored (and is counted
// in the entry that closes the run).
func (r *Recorder) ContentEvent(category, message string, data map[string]any) error {
	return r.ContentEventAt(time.Now(), category, message, data)
}

// ContentEventAt is ContentEvent for something that started at, earlier:
// a command's entry carries its result but is placed at its start, so the
// parallel commands of one model turn share their t.
func (r *Recorder) ContentEventAt(at time.Time, category, message string, data map[string]any) error {
	e := r.contentEntry(category, message, data)
	if n := entrySize(e); !r.timeline.admit(n) {
		r.timeline.drop(n)
		return nil
	}
	_, err := r.appendAt(at, e)
	return err
}

// StartContentEvent appends a content entry for something that started at
// and is still going, and returns its sequence number for
// AmendContentEvent: live readers see it at once and see it again when
// amended. Past the timeline's cap nothing is stored and the sequence
// number is 0; amending it counts the entry as left out.
func (r *Recorder) StartContentEvent(at time.Time, category, message string, data map[string]any) (seq int64, err error) {
	e := r.contentEntry(category, message, data)
	if !r.timeline.admit(entrySize(e)) {
		return 0, nil
	}
	e, err = r.appendAt(at, e)
	return e.Seq, err
}

// AmendContentEvent replaces the data of the run's entry seq, appended by
// StartContentEvent, with data under the same rules: under zero data
// retention only numbers, flags and timeline.State values are kept, and the
// entry is purged with the run's content. Data that would take the
// timeline past its cap is stored without its content (the same values
// zero retention keeps), marked "content_dropped".
func (r *Recorder) AmendContentEvent(seq int64, data map[string]any) error {
	stored := mustJSON(r.retained(data))
	if seq == 0 {
		r.timeline.drop(int64(len(stored)))
		return nil
	}
	if full := int64(len(stored)); !r.timeline.admit(full) {
		kept := contentFree(data)
		kept["content_dropped"] = true
		stored = mustJSON(kept)
		r.timeline.cutShort(full, int64(len(stored)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	if _, err := r.svc.store.AmendEventData(ctx, r.runID, seq, stored, true); err != nil {
		return err
	}
	r.svc.hub.Notify(r.runID)
	return nil
}

// contentEntry is a content entry as it may be stored.
func (r *Recorder) contentEntry(category, message string, data map[string]any) store.Event {
	if r.zeroRetention {
		message = Withheld
	}
	return store.Event{Category: category, Message: message, Data: mustJSON(r.retained(data)), Content: true}
}

// retained is what of a content entry's data may be stored: everything,
// or under zero data retention only the values that cannot carry user
// content.
func (r *Recorder) retained(data map[string]any) map[string]any {
	if !r.zeroRetention {
		return data
	}
	return contentFree(data)
}

// contentFree keeps of data only the values that cannot carry user
// content: numbers, flags and timeline states.
func contentFree(data map[string]any) map[string]any {
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

// ErrOutputNotKept means an output file was not kept: the zero-data-
// retention files the daemon holds in memory would pass their cap.
var ErrOutputNotKept = errors.New("the daemon holds its maximum of zero-data-retention output files in memory")

// Output keeps a file the run produced, under path (checked by the caller
// with package outputs). It is run content: stored with the run and
// purged with it, or under zero data retention held in memory only, for
// a while after the run ends, and returned once.
func (r *Recorder) Output(path string, data []byte) error {
	sum := sha256.Sum256(data)
	o := store.Output{Path: path, Size: int64(len(data)), SHA256: sum[:], ContentType: outputs.ContentType(path, data), Data: data}
	if r.zeroRetention {
		if !r.svc.holdVolatile(o.Size) {
			return ErrOutputNotKept
		}
		r.mu.Lock()
		r.files = append(r.files, o)
		r.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	return r.svc.store.AddOutput(ctx, r.runID, o)
}

// takeFiles hands over the zero-data-retention files held so far.
func (r *Recorder) takeFiles() []store.Output {
	r.mu.Lock()
	defer r.mu.Unlock()
	files := r.files
	r.files = nil
	return files
}

// Remaining is what the run may still spend, in micros: check it before
// starting something that costs money.
func (r *Recorder) Remaining() int64 { return r.meter.Remaining() }

// StartClock starts the run's timeout: the Executor calls it when the
// run's microVM is ready, since neither the queue nor the boot counts
// against timeout_seconds (until then the boot limit bounds the run). It
// returns ctx bounded by the run's deadline, for the work that follows
// and for what needs to know the time left; the run is stopped at the
// deadline whichever context its work uses. Calling it again returns the
// same deadline.
func (r *Recorder) StartClock(ctx context.Context) (context.Context, context.CancelFunc) {
	return r.clock.start(ctx)
}

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
