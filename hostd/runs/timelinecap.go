package runs

import (
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// timelineCap bounds the bytes a run's timeline stores: guest output and
// model-chosen commands would otherwise grow it without limit. Entries
// count their category, message and data as written (an amendment counts
// its new data). The system's own entries are few and always stored, but
// count; a content entry past the cap is not stored, and an amendment
// past it is stored without its content. It is safe for concurrent use: a
// run's parallel commands and its broker write at once.
type timelineCap struct {
	limit int64

	mu           sync.Mutex
	used         int64
	dropped      int64 // entries not stored
	cut          int64 // entries stored without their content
	droppedBytes int64
}

func entrySize(e store.Event) int64 {
	return int64(len(e.Category) + len(e.Message) + len(e.Data))
}

// admit takes n bytes of the cap if they fit.
func (c *timelineCap) admit(n int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used+n > c.limit {
		return false
	}
	c.used += n
	return true
}

// charge counts n bytes stored whatever the cap.
func (c *timelineCap) charge(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.used += n
}

// drop counts an entry of n bytes that was not stored.
func (c *timelineCap) drop(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropped++
	c.droppedBytes += n
}

// cutShort counts an entry stored with kept of its full bytes.
func (c *timelineCap) cutShort(full, kept int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut++
	c.used += kept
	c.droppedBytes += max(full-kept, 0)
}

// leftOut is the entry, placed at t, that says what the cap left out; none
// when it left out nothing.
func (c *timelineCap) leftOut(t time.Duration) []store.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dropped == 0 && c.cut == 0 {
		return nil
	}
	return []store.Event{{T: t, Category: timeline.Timeline,
		Message: timeline.TimelineCapped(c.dropped, c.cut, c.droppedBytes, c.limit),
		Data: mustJSON(map[string]any{"dropped_entries": c.dropped, "cut_entries": c.cut,
			"dropped_bytes": c.droppedBytes, "limit_bytes": c.limit})}}
}
