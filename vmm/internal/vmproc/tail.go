package vmproc

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// ConsoleTailSize bounds what is kept of the guest console and the VMM's
// own output: enough for a kernel panic with its backtrace.
const ConsoleTailSize = 64 << 10

// TailBuffer keeps the last bytes written to it in a fixed ring, so a
// guest that prints without end costs no more memory than the ring.
type TailBuffer struct {
	mu   sync.Mutex
	ring []byte
	next int  // where the next byte goes
	full bool // the ring has wrapped at least once
}

func NewTailBuffer(size int) *TailBuffer {
	return &TailBuffer{ring: make([]byte, size)}
}

func (t *TailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= len(t.ring) {
		p = p[len(p)-len(t.ring):]
	}
	for len(p) > 0 {
		c := copy(t.ring[t.next:], p)
		p = p[c:]
		t.next += c
		if t.next == len(t.ring) {
			t.next = 0
			t.full = true
		}
	}
	return n, nil
}

// String returns the kept bytes, oldest first.
func (t *TailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.full {
		return string(t.ring[:t.next])
	}
	return string(t.ring[t.next:]) + string(t.ring[:t.next])
}

// ErrorTailSize is how much console an error message quotes.
const ErrorTailSize = 2 << 10

// PrintableTail returns the end of console text for an error message,
// with control characters (terminal escapes the guest may print) replaced
// so the message cannot rewrite a log line or terminal.
func PrintableTail(console string) string {
	if len(console) > ErrorTailSize {
		console = console[len(console)-ErrorTailSize:]
		// Do not start in the middle of a UTF-8 sequence.
		for len(console) > 0 && !utf8.RuneStart(console[0]) {
			console = console[1:]
		}
	}
	console = strings.TrimSpace(console)
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' {
			return r
		}
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, console)
}
