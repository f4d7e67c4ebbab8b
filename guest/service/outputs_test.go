package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// outputScratch fills a scratch directory the way hostile guest code
// could: files, a symlink to a secret, a symlinked directory, a FIFO.
func outputScratch(t *testing.T, s *Service) (secret string) {
	t.Helper()
	outside := t.TempDir()
	secret = filepath.Join(outside, "shadow")
	must(t, os.WriteFile(secret, []byte("root:secret"), 0o644))
	must(t, os.WriteFile(filepath.Join(outside, "c.csv"), []byte("c"), 0o644))
	scratch := s.Runner.ScratchDir
	must(t, os.MkdirAll(filepath.Join(scratch, "out", "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(scratch, "report.md"), []byte("# report\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(scratch, "out", "a.csv"), []byte("a,b\n1,2\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(scratch, "out", "b.txt"), []byte("b"), 0o644))
	must(t, os.Symlink(secret, filepath.Join(scratch, "out", "link.csv")))
	must(t, unix.Mkfifo(filepath.Join(scratch, "out", "pipe.csv"), 0o644))
	must(t, os.Symlink(outside, filepath.Join(scratch, "linkdir")))
	return secret
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestListOutputsFollowsNoSymlink(t *testing.T) {
	s := newService(t)
	outputScratch(t, s)
	l, err := s.ListOutputs(context.Background(), vsockproto.OutputsRequest{
		Patterns:   []string{"report.md", "out/*.csv", "linkdir/*.csv", "missing.txt", "out/*", "*/c.csv"},
		MaxEntries: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range l.Entries {
		got = append(got, fmt.Sprintf("%d %s %s %d", e.Pattern, e.Path, e.Kind, e.Size))
	}
	want := []string{
		"0 report.md file 9",
		"1 out/a.csv file 8",
		"1 out/link.csv symlink 0",
		"1 out/pipe.csv other 0",
		"2 linkdir symlink 0", // named literally: listed, not entered
		"4 out/a.csv file 8",
		"4 out/b.txt file 1",
		"4 out/link.csv symlink 0",
		"4 out/pipe.csv other 0",
		"4 out/sub dir 0",
		// "*/c.csv" enters no symlinked directory and says nothing of it.
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || l.Truncated {
		t.Errorf("listing (truncated %v):\n%s\nwant:\n%s", l.Truncated, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	l, err = s.ListOutputs(context.Background(), vsockproto.OutputsRequest{Patterns: []string{"out/*", "report.md"}, MaxEntries: 3})
	if err != nil || len(l.Entries) != 3 || !l.Truncated {
		t.Errorf("listing capped at 3: %d entries, truncated %v, %v", len(l.Entries), l.Truncated, err)
	}
}

func TestReadOutputRefusesSymlinksAndSpecialFiles(t *testing.T) {
	s := newService(t)
	secret := outputScratch(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := s.ReadOutput(ctx, vsockproto.FileRequest{Path: "out/a.csv", MaxBytes: 100}, &out); err != nil || out.String() != "a,b\n1,2\n" {
		t.Fatalf("read out/a.csv: %q, %v", out.String(), err)
	}
	for _, p := range []string{"out/link.csv", "linkdir/c.csv", "out/pipe.csv", "out/sub", "../x", "out/../report.md", "missing", secret} {
		out.Reset()
		if err := s.ReadOutput(ctx, vsockproto.FileRequest{Path: strings.TrimPrefix(p, "/"), MaxBytes: 100}, &out); err == nil || out.Len() != 0 {
			t.Errorf("read %s: %q, %v; want an error before anything is sent", p, out.String(), err)
		}
	}
	if err := s.ReadOutput(ctx, vsockproto.FileRequest{Path: "report.md", MaxBytes: 4}, io.Discard); err == nil {
		t.Error("read of 9 bytes with MaxBytes 4 succeeded")
	}
}

// The walk that stands in for openat2 on older kernels refuses the same.
func TestOpenBeneathWalk(t *testing.T) {
	s := newService(t)
	outputScratch(t, s)
	root, err := unix.Open(s.Runner.ScratchDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(root)
	fd, err := openBeneathWalk(root, "out/a.csv")
	if err != nil {
		t.Fatalf("open out/a.csv: %v", err)
	}
	unix.Close(fd)
	for _, p := range []string{"out/link.csv", "linkdir/c.csv", "../x", "out/../report.md", "out//a.csv", "./report.md"} {
		if fd, err := openBeneathWalk(root, p); err == nil {
			unix.Close(fd)
			t.Errorf("open %s succeeded", p)
		}
	}
	if _, err := openBeneathWalk(root, "linkdir/c.csv"); err != errSymlink {
		t.Errorf("open through a symlinked directory: %v, want %v", err, errSymlink)
	}
}

// Files and directories only root may read stay unreadable: the init
// reads as the worker.
func TestOutputsAreReadAsTheWorker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user; run the tests as root")
	}
	s := newService(t)
	const nobody = 65534
	passwd := fmt.Sprintf("worker:x:%d:%d::/nonexistent:/bin/sh\n", nobody, nobody)
	must(t, os.WriteFile(filepath.Join(s.Runner.Root, "etc", "passwd"), []byte(passwd), 0o644))
	must(t, os.Chown(s.Runner.ScratchDir, nobody, nobody))
	for d := filepath.Dir(s.Runner.ScratchDir); d != os.TempDir(); d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
	scratch := s.Runner.ScratchDir
	must(t, os.WriteFile(filepath.Join(scratch, "rootonly.txt"), []byte("secret"), 0o600))
	must(t, os.Mkdir(filepath.Join(scratch, "private"), 0o700))
	must(t, os.WriteFile(filepath.Join(scratch, "private", "x.txt"), []byte("secret"), 0o644))
	must(t, os.WriteFile(filepath.Join(scratch, "mine.txt"), []byte("mine"), 0o644))
	must(t, os.Chown(filepath.Join(scratch, "mine.txt"), nobody, nobody))

	ctx := context.Background()
	if err := s.ReadOutput(ctx, vsockproto.FileRequest{Path: "rootonly.txt"}, io.Discard); err == nil {
		t.Error("the worker's read of a root-only file succeeded")
	}
	var out bytes.Buffer
	if err := s.ReadOutput(ctx, vsockproto.FileRequest{Path: "mine.txt"}, &out); err != nil || out.String() != "mine" {
		t.Errorf("the worker's own file: %q, %v", out.String(), err)
	}
	l, err := s.ListOutputs(ctx, vsockproto.OutputsRequest{Patterns: []string{"private/*.txt"}, MaxEntries: 10})
	if err != nil || len(l.Entries) != 1 || l.Entries[0].Kind != vsockproto.OutputError || !strings.Contains(l.Entries[0].Error, "permission denied") {
		t.Errorf("listing a root-only directory: %+v, %v", l, err)
	}
	if st, err := os.Stat(filepath.Join(scratch, "rootonly.txt")); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("root-only file changed: %v", err)
	}
}
