package cloudhypervisor

import (
	"strings"
	"testing"
)

func TestTailBufferKeepsOnlyTheEnd(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"under the limit", []string{"ab", "cd"}, "abcd"},
		{"exactly the limit", []string{"abcdefgh"}, "abcdefgh"},
		{"overflow across writes", []string{"abcde", "fghij"}, "cdefghij"},
		{"one write larger than the limit", []string{"0123456789abcdef"}, "89abcdef"},
		{"many small writes", strings.Split("the quick brown fox", ""), "rown fox"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newTailBuffer(8)
			for _, w := range tt.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if got := b.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestPrintableTailDefusesTerminalEscapes(t *testing.T) {
	got := printableTail("boot ok\n\x1b[2J\x1b]0;pwned\x07panic: oops\r\n")
	if strings.ContainsAny(got, "\x1b\x07\r") {
		t.Errorf("printableTail kept control characters: %q", got)
	}
	if !strings.Contains(got, "panic: oops") || !strings.Contains(got, "boot ok\n") {
		t.Errorf("printableTail lost the text: %q", got)
	}
	long := strings.Repeat("é", errorTailSize) // 2 bytes each
	if got := printableTail(long); len(got) > errorTailSize || strings.ContainsRune(got, '?') {
		t.Errorf("printableTail of long UTF-8 text: %d bytes, split rune replaced: %v", len(got), strings.ContainsRune(got, '?'))
	}
}
