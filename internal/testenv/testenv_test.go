package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func TestStateDir(t *testing.T) {
	t.Setenv("EPHEMERAL_STATE_DIR", "")
	if got := StateDir(); got != DefaultStateDir {
		t.Errorf("StateDir() without EPHEMERAL_STATE_DIR = %q, want %q", got, DefaultStateDir)
	}
	t.Setenv("EPHEMERAL_STATE_DIR", "/srv/eph")
	if got := StateDir(); got != "/srv/eph" {
		t.Errorf("StateDir() = %q, want EPHEMERAL_STATE_DIR's /srv/eph", got)
	}
}

// recorder stands in for a test to see what Skip does to it. Like a real
// test, it stops the calling goroutine on Skip and Fatalf.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// skip runs Skip on a recorder, in a goroutine of its own as Goexit needs.
func skip(format string, args ...any) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Skip(r, format, args...)
	}()
	<-done
	return r
}

func TestSkipFailsWhenVMsAreRequired(t *testing.T) {
	t.Setenv(RequireVMEnv, "")
	if r := skip("no %s", "qemu"); r.skipped != "no qemu" || r.failed != "" {
		t.Errorf("without %s: skipped %q, failed %q; want a skip", RequireVMEnv, r.skipped, r.failed)
	}
	t.Setenv(RequireVMEnv, "1")
	if r := skip("no %s", "qemu"); r.skipped != "" || !strings.Contains(r.failed, "no qemu") {
		t.Errorf("with %s=1: skipped %q, failed %q; want a failure saying why", RequireVMEnv, r.skipped, r.failed)
	}
}

func TestSyncBufferConcurrentReads(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 1000 {
			b.Write([]byte("x"))
		}
	})
	for range 100 {
		_ = b.String()
	}
	wg.Wait()
	if got := b.String(); len(got) != 1000 {
		t.Errorf("len = %d, want 1000", len(got))
	}
}
