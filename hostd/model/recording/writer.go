package recording

import (
	"fmt"
	"sync"
)

// Sink stores a recording as its Writer produces it (a run's store).
type Sink interface {
	// AppendExchange stores the entry of one turn; turns come in order.
	AppendExchange(turn int, entry []byte) error
	// Truncated stores the recording's truncation mark, replacing the
	// one before: it is called when the cap cuts the recording and again
	// for every turn dropped after that.
	Truncated(Truncation) error
}

// Writer is the Recorder of a run: it encodes each exchange as the change
// from the previous request and hands the entry to its Sink at once, so a
// recording survives a crash mid-run and the whole conversation is never
// re-encoded. Once the entries would pass the size cap, that turn and all
// later ones are dropped and the recording is marked truncated. It is safe
// for concurrent use.
type Writer struct {
	sink  Sink
	limit int64

	mu      sync.Mutex
	enc     deltaEncoder
	written int64
	kept    int // the last turn stored
	cut     *Truncation
	err     error
}

// NewWriter returns a Writer that stores at most limitBytes of entries
// in sink.
func NewWriter(sink Sink, limitBytes int64) *Writer {
	return &Writer{sink: sink, limit: limitBytes}
}

// Record stores ex, or counts it as dropped once the recording has
// reached its cap. After the sink fails nothing more is recorded: later
// entries would build on a turn that is missing.
func (w *Writer) Record(ex Exchange) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	b, err := w.enc.encode(ex)
	if err != nil {
		w.err = err
		return
	}
	size := int64(len(b))
	if w.cut == nil && w.written+size <= w.limit {
		if err := w.sink.AppendExchange(ex.Turn, b); err != nil {
			w.err = fmt.Errorf("recording: store turn %d: %w", ex.Turn, err)
			return
		}
		w.written += size
		w.kept = ex.Turn
		return
	}
	if w.cut == nil {
		w.cut = &Truncation{KeptTurns: w.kept, LimitBytes: w.limit}
	}
	w.cut.DroppedTurns++
	w.cut.DroppedBytes += size
	if err := w.sink.Truncated(*w.cut); err != nil {
		w.err = fmt.Errorf("recording: mark truncated at turn %d: %w", ex.Turn, err)
	}
}

// Err is the sink's first failure, which ended the recording; nil when
// every exchange was stored or counted as dropped.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
