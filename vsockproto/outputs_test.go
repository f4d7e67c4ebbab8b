package vsockproto

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestListOutputsRoundTrip(t *testing.T) {
	g := newFakeGuest()
	g.listing = OutputListing{Entries: []OutputEntry{
		{Pattern: 0, Path: "report.md", Kind: OutputFile, Size: 12},
		{Pattern: 1, Path: "out", Kind: OutputSymlink},
		{Pattern: 1, Path: "out/x", Kind: OutputError, Error: strings.Repeat("e", 1000)},
	}}
	c, _ := startPair(t, netPipe, g)
	got, err := c.ListOutputs(context.Background(), OutputsRequest{Patterns: []string{"report.md", "out/*.csv"}, MaxEntries: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != 3 || got.Truncated || got.Entries[0] != g.listing.Entries[0] || got.Entries[1] != g.listing.Entries[1] ||
		len(got.Entries[2].Error) != maxEntryError {
		t.Errorf("listing %+v", got)
	}

	// A guest that lists more than asked is cut at the cap, marked.
	got, err = c.ListOutputs(context.Background(), OutputsRequest{Patterns: []string{"a", "b"}, MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != 2 || !got.Truncated {
		t.Errorf("listing of 3 with max 2: %d entries, truncated %v", len(got.Entries), got.Truncated)
	}
}

func TestReadOutputStopsAtTheHostsCap(t *testing.T) {
	g := newFakeGuest()
	g.files["big"] = pattern(100_000)
	c, _ := startPair(t, netPipe, g)
	var full bytes.Buffer
	if err := c.ReadOutput(context.Background(), FileRequest{Path: "big", MaxBytes: 100_000}, &full); err != nil || full.Len() != 100_000 {
		t.Fatalf("read %d bytes, %v", full.Len(), err)
	}
	// The fake ignores MaxBytes; the host's writer is what holds.
	capped := &boundedBuffer{max: 1000}
	err := c.ReadOutput(context.Background(), FileRequest{Path: "big", MaxBytes: 1000}, capped)
	if !errors.Is(err, errListingTooLarge) || len(capped.Bytes()) > 1000 {
		t.Errorf("read past the cap: %v, kept %d bytes", err, len(capped.Bytes()))
	}
	// The connection is still usable.
	if err := c.ReadOutput(context.Background(), FileRequest{Path: "big"}, io.Discard); err != nil {
		t.Errorf("read after a capped read: %v", err)
	}
	if _, err := c.ListOutputs(context.Background(), OutputsRequest{Patterns: []string{"/etc/*"}, MaxEntries: 1}); err == nil {
		t.Error("an absolute pattern was sent")
	}
	if err := c.ReadOutput(context.Background(), FileRequest{Path: "/etc/shadow"}, io.Discard); err == nil {
		t.Error("an absolute output path was sent")
	}
}

func TestDecodeListingRejectsHostileListings(t *testing.T) {
	entry := `{"entry":{"pattern":0,"path":"a","kind":"file","size":1}}` + "\n"
	for _, tc := range []struct{ name, data string }{
		{"no final newline", strings.TrimSuffix(entry, "\n")},
		{"unknown field", `{"entry":{"pattern":0,"path":"a","kind":"file","mode":1}}` + "\n"},
		{"unknown kind", `{"entry":{"pattern":0,"path":"a","kind":"fifo"}}` + "\n"},
		{"pattern out of range", `{"entry":{"pattern":2,"path":"a","kind":"file"}}` + "\n"},
		{"negative pattern", `{"entry":{"pattern":-1,"path":"a","kind":"file"}}` + "\n"},
		{"negative size", `{"entry":{"pattern":0,"path":"a","kind":"file","size":-5}}` + "\n"},
		{"empty path", `{"entry":{"pattern":0,"path":"","kind":"file"}}` + "\n"},
		{"empty line", entry + "\n"},
		{"both", `{"entry":{"pattern":0,"path":"a","kind":"file"},"truncated":true}` + "\n"},
		{"after truncation", `{"truncated":true}` + "\n" + entry},
		{"too many", entry + entry + entry},
		{"long line", `{"entry":{"pattern":0,"kind":"file","path":"` + strings.Repeat("a", maxListingLine) + `"}}` + "\n"},
		{"trailing data", `{"truncated":true} {}` + "\n"},
	} {
		if _, err := decodeListing([]byte(tc.data), 2, 2); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: err %v, want a protocol violation", tc.name, err)
		}
	}
	l, err := decodeListing([]byte(entry+entry+`{"truncated":true}`+"\n"), 2, 2)
	if err != nil || len(l.Entries) != 2 || !l.Truncated {
		t.Errorf("valid listing: %+v, %v", l, err)
	}
}

// FuzzDecodeListing plays a hostile guest's listing: the decoder never
// panics, and what it accepts keeps the promises the host relies on.
func FuzzDecodeListing(f *testing.F) {
	f.Add(encodeListing(OutputListing{Entries: []OutputEntry{{Path: "report.md", Kind: OutputFile, Size: 3}, {Pattern: 1, Path: "out", Kind: OutputSymlink}}}))
	f.Add(encodeListing(OutputListing{Entries: []OutputEntry{{Path: "x\x01\xff", Kind: OutputError, Error: "denied"}}, Truncated: true}))
	f.Add([]byte(`{"entry":{"pattern":0,"path":"a","kind":"file","size":1e99}}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const patterns, max = 2, 8
		l, err := decodeListing(data, patterns, max)
		if err != nil {
			return
		}
		if len(l.Entries) > max {
			t.Fatalf("%d entries accepted, max %d", len(l.Entries), max)
		}
		for _, e := range l.Entries {
			if e.Pattern < 0 || e.Pattern >= patterns || e.Path == "" || e.Size < 0 || !outputKinds[e.Kind] {
				t.Fatalf("implausible entry accepted: %+v", e)
			}
		}
		again, err := decodeListing(encodeListing(l), patterns, max)
		if err != nil || len(again.Entries) != len(l.Entries) || again.Truncated != l.Truncated {
			t.Fatalf("re-encoded listing decodes to %+v, %v; want %+v", again, err, l)
		}
	})
}

// BenchmarkReadOutputThroughput copies a 10 MiB output (the default
// per-file cap) over a socketpair into the host's capped buffer.
func BenchmarkReadOutputThroughput(b *testing.B) {
	const size = 10 << 20
	g := newFakeGuest()
	g.files["big"] = pattern(size)
	c, _ := startPair(b, unixPair, g)
	b.SetBytes(size)
	for b.Loop() {
		buf := &boundedBuffer{max: size}
		if err := c.ReadOutput(context.Background(), FileRequest{Path: "big", MaxBytes: size}, buf); err != nil {
			b.Fatal(err)
		}
	}
}
