package vsockproto

import (
	"fmt"
	"sync"
)

// CappedBuffer is an io.Writer that keeps at most a fixed number of bytes
// of what is written to it: the first half of the limit and the most recent
// rest, dropping the middle. It is meant for process output shown to a
// model or a user, where the start (the command's first reaction) and the
// end (the final error) matter most. It is safe for concurrent use.
type CappedBuffer struct {
	mu    sync.Mutex
	limit int
	head  []byte
	tail  []byte // ring of the last tailCap bytes once full
	start int    // index of the oldest byte in tail when full
	total int64
}

// NewCappedBuffer keeps at most limit bytes (limit >= 0).
func NewCappedBuffer(limit int) *CappedBuffer {
	limit = max(limit, 0)
	return &CappedBuffer{limit: limit}
}

func (b *CappedBuffer) headCap() int { return b.limit / 2 }
func (b *CappedBuffer) tailCap() int { return b.limit - b.limit/2 }

// Write never fails; bytes beyond the limit replace the middle.
func (b *CappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	n := len(p)
	if room := b.headCap() - len(b.head); room > 0 {
		take := min(room, len(p))
		b.head = append(b.head, p[:take]...)
		p = p[take:]
	}
	b.appendTail(p)
	return n, nil
}

func (b *CappedBuffer) appendTail(p []byte) {
	tailCap := b.tailCap()
	if tailCap == 0 {
		return
	}
	if len(p) >= tailCap {
		b.tail = append(b.tail[:0], p[len(p)-tailCap:]...)
		b.start = 0
		return
	}
	if room := tailCap - len(b.tail); room > 0 {
		take := min(room, len(p))
		b.tail = append(b.tail, p[:take]...)
		p = p[take:]
	}
	for len(p) > 0 { // full ring: overwrite the oldest bytes
		n := copy(b.tail[b.start:], p)
		p = p[n:]
		b.start = (b.start + n) % tailCap
	}
}

// Total is the number of bytes written, kept or not.
func (b *CappedBuffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// Truncated reports whether bytes were dropped.
func (b *CappedBuffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total > int64(b.limit)
}

// Bytes returns what was kept: everything when nothing was dropped,
// otherwise the head, a marker naming how many bytes were cut, and the
// tail.
func (b *CappedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]byte, 0, len(b.head)+len(b.tail)+64)
	out = append(out, b.head...)
	if dropped := b.total - int64(len(b.head)+len(b.tail)); dropped > 0 {
		out = fmt.Appendf(out, "\n[... %d bytes omitted ...]\n", dropped)
	}
	out = append(out, b.tail[b.start:]...)
	return append(out, b.tail[:b.start]...)
}
