package vmproc

import (
	"strings"
	"testing"
)

func TestTailBufferKeepsTheEnd(t *testing.T) {
	tests := []struct {
		name   string
		size   int
		writes []string
		want   string
	}{
		{"under capacity", 8, []string{"abc", "de"}, "abcde"},
		{"exactly full", 4, []string{"ab", "cd"}, "abcd"},
		{"wraps", 4, []string{"abc", "def"}, "cdef"},
		{"one write larger than the ring", 4, []string{"x", "abcdefgh"}, "efgh"},
		{"many small writes", 3, strings.Split("the quick brown fox", ""), "fox"},
		{"nothing written", 4, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := NewTailBuffer(tt.size)
			for _, w := range tt.writes {
				n, err := tb.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w, n, err, len(w))
				}
			}
			if got := tb.String(); got != tt.want {
				t.Fatalf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestPrintableTail(t *testing.T) {
	tests := []struct {
		name, console, want string
	}{
		{"kernel panic kept", "[ 0.8] Kernel panic - not syncing\n", "[ 0.8] Kernel panic - not syncing"},
		{"terminal escapes neutralised", "ok\x1b[2J\x1b]0;owned\x07\r\n", "ok?[2J?]0;owned?"},
		{"invalid utf-8 replaced", "a\xffb", "a?b"},
		{"long console cut to the end", strings.Repeat("x", ErrorTailSize) + "END", strings.Repeat("x", ErrorTailSize-3) + "END"},
		{"cut does not split a rune", "ü" + strings.Repeat("y", ErrorTailSize-1), strings.Repeat("y", ErrorTailSize-1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PrintableTail(tt.console); got != tt.want {
				t.Fatalf("PrintableTail(%.40q) = %.60q, want %.60q", tt.console, got, tt.want)
			}
		})
	}
}

func TestPrintableTailKeepsLongUTF8Whole(t *testing.T) {
	long := strings.Repeat("é", ErrorTailSize) // 2 bytes each
	if got := PrintableTail(long); len(got) > ErrorTailSize || strings.ContainsRune(got, '?') {
		t.Errorf("PrintableTail of long UTF-8 text: %d bytes, split rune replaced: %v", len(got), strings.ContainsRune(got, '?'))
	}
}
