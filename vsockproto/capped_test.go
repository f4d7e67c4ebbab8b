package vsockproto

import (
	"bytes"
	"fmt"
	"testing"
)

func TestCappedBuffer(t *testing.T) {
	tests := []struct {
		name   string
		limit  int
		writes []string
		want   string
	}{
		{"fits", 10, []string{"abc", "def"}, "abcdef"},
		{"exactly full", 6, []string{"abcdef"}, "abcdef"},
		{"one write over", 6, []string{"abcdefgh"}, "abc\n[... 2 bytes omitted ...]\nfgh"},
		{"many small writes", 4, []string{"a", "b", "c", "d", "e", "f", "g"}, "ab\n[... 3 bytes omitted ...]\nfg"},
		{"tail wraps", 6, []string{"abc", "de", "fg", "hi", "j"}, "abc\n[... 4 bytes omitted ...]\nhij"},
		{"odd limit", 5, []string{"0123456789"}, "01\n[... 5 bytes omitted ...]\n789"},
		{"zero limit", 0, []string{"abc"}, "\n[... 3 bytes omitted ...]\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewCappedBuffer(tt.limit)
			var total int
			for _, w := range tt.writes {
				n, err := b.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
				total += len(w)
			}
			if got := string(b.Bytes()); got != tt.want {
				t.Errorf("Bytes() = %q, want %q", got, tt.want)
			}
			if b.Total() != int64(total) {
				t.Errorf("Total() = %d, want %d", b.Total(), total)
			}
			if b.Truncated() != (total > tt.limit) {
				t.Errorf("Truncated() = %v with %d bytes into a limit of %d", b.Truncated(), total, tt.limit)
			}
		})
	}
}

// TestCappedBufferKeepsHeadAndTail compares against the obvious model over
// many write sizes.
func TestCappedBufferKeepsHeadAndTail(t *testing.T) {
	var all bytes.Buffer
	for i := range 5000 {
		fmt.Fprintf(&all, "line %d\n", i)
	}
	for _, chunk := range []int{1, 7, 100, 4096, all.Len()} {
		b := NewCappedBuffer(1000)
		data := all.Bytes()
		for len(data) > 0 {
			n := min(chunk, len(data))
			b.Write(data[:n])
			data = data[n:]
		}
		want := fmt.Sprintf("%s\n[... %d bytes omitted ...]\n%s", all.Bytes()[:500], all.Len()-1000, all.Bytes()[all.Len()-500:])
		if got := string(b.Bytes()); got != want {
			t.Errorf("chunk %d: kept bytes differ from head+marker+tail", chunk)
		}
	}
}
