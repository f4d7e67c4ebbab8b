package cloudhypervisor

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// tailBuffer keeps the last limit bytes written to it, so a guest that
// prints without end costs a fixed amount of host memory.
type tailBuffer struct {
	mu    sync.Mutex
	buf   []byte
	limit int
}

func newTailBuffer(limit int) *tailBuffer {
	return &tailBuffer{buf: make([]byte, 0, limit), limit: limit}
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.limit {
		t.buf = append(t.buf[:0], p[len(p)-t.limit:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.limit; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept bytes, oldest first.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// errorTailSize is how much VMM output an error message quotes.
const errorTailSize = 2 << 10

// printableTail returns the end of text for an error message, with control
// characters (terminal escapes) replaced so the message cannot rewrite a
// log line or terminal.
func printableTail(text string) string {
	if len(text) > errorTailSize {
		text = text[len(text)-errorTailSize:]
		for len(text) > 0 && !utf8.RuneStart(text[0]) {
			text = text[1:]
		}
	}
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' {
			return r
		}
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.TrimSpace(text))
}
