package cpio

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
)

// member is one entry as an independent newc parser sees it.
type member struct {
	name                 string
	mode, uid, gid, ino  uint32
	rdevMajor, rdevMinor uint32
	body                 string
}

// readArchive parses a newc archive strictly, failing on any misalignment,
// so that it checks the writer rather than trusting it.
func readArchive(t *testing.T, data []byte) []member {
	t.Helper()
	var out []member
	off := 0
	align := func() {
		off = (off + 3) &^ 3
	}
	for {
		if off+headerLen > len(data) {
			t.Fatalf("archive truncated at offset %d (no trailer)", off)
		}
		hdr := data[off : off+headerLen]
		if string(hdr[:6]) != "070701" {
			t.Fatalf("bad magic %q at offset %d", hdr[:6], off)
		}
		var f [13]uint32
		for i := range f {
			v, err := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("field %d at offset %d: %v", i, off, err)
			}
			f[i] = uint32(v)
		}
		off += headerLen
		nameSize, fileSize := int(f[11]), int(f[6])
		name := data[off : off+nameSize]
		if name[nameSize-1] != 0 {
			t.Fatalf("name %q not NUL-terminated", name)
		}
		off += nameSize
		align()
		body := data[off : off+fileSize]
		off += fileSize
		align()
		m := member{name: string(name[:nameSize-1]), ino: f[0], mode: f[1], uid: f[2], gid: f[3],
			rdevMajor: f[9], rdevMinor: f[10], body: string(body)}
		if m.name == trailerName {
			if off != len(data) {
				t.Fatalf("%d bytes after trailer", len(data)-off)
			}
			return out
		}
		out = append(out, m)
	}
}

func TestWriterRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	steps := []error{
		w.Dir(Entry{Name: "/dev", Perm: 0o755}),
		w.CharDevice(Entry{Name: "dev/console", Perm: 0o600}, 5, 1),
		w.File(Entry{Name: "init", Perm: 0o755}, 5, strings.NewReader("hello")),
		w.File(Entry{Name: "empty", Perm: 0o644, UID: 1000, GID: 1000}, 0, nil),
		w.Symlink(Entry{Name: "bin", Perm: 0o777}, "usr/bin"),
		w.Close(),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	got := readArchive(t, buf.Bytes())
	want := []member{
		{name: "dev", mode: 0o040755},
		{name: "dev/console", mode: 0o020600, rdevMajor: 5, rdevMinor: 1},
		{name: "init", mode: 0o100755, body: "hello"},
		{name: "empty", mode: 0o100644, uid: 1000, gid: 1000},
		{name: "bin", mode: 0o120777, body: "usr/bin"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d members, want %d: %+v", len(got), len(want), got)
	}
	seen := map[uint32]string{}
	for i := range want {
		g := got[i]
		if prev, dup := seen[g.ino]; dup {
			t.Errorf("%s and %s share inode %d: the kernel would hard-link them", prev, g.name, g.ino)
		}
		seen[g.ino] = g.name
		g.ino = 0
		if g != want[i] {
			t.Errorf("member %d = %+v, want %+v", i, g, want[i])
		}
	}
}

func TestWriterAlignsEveryNameLength(t *testing.T) {
	// Names of every length modulo 4 and bodies of every length modulo 4
	// exercise all padding cases.
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for n := 1; n <= 8; n++ {
		name := strings.Repeat("a", n)
		body := strings.Repeat("b", n)
		if err := w.File(Entry{Name: name, Perm: 0o644}, int64(n), strings.NewReader(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := readArchive(t, buf.Bytes())
	for i, m := range got {
		if want := strings.Repeat("b", i+1); m.body != want {
			t.Errorf("%s: body %q, want %q", m.name, m.body, want)
		}
	}
}

func TestWriterRejects(t *testing.T) {
	cases := []struct {
		name string
		do   func(w *Writer) error
	}{
		{"empty name", func(w *Writer) error { return w.Dir(Entry{Name: "/"}) }},
		{"NUL in name", func(w *Writer) error { return w.Dir(Entry{Name: "a\x00b"}) }},
		{"short body", func(w *Writer) error {
			return w.File(Entry{Name: "f"}, 10, strings.NewReader("abc"))
		}},
		{"write after close", func(w *Writer) error {
			if err := w.Close(); err != nil {
				return err
			}
			return w.Dir(Entry{Name: "late"})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.do(NewWriter(io.Discard)); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

func ExampleWriter() {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	_ = w.File(Entry{Name: "init", Perm: 0o755}, 2, strings.NewReader("#!"))
	_ = w.Close()
	fmt.Println(buf.Len()%4 == 0, strings.HasPrefix(buf.String(), "070701"))
	// Output: true true
}
