package tests

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// The product page's four steps, each checked against what really happened
// in the VM.
func TestProductPageSteps(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)

	primes := run(t, sb, `printf '%s\n' '#!/usr/bin/env python3' 'primes = []' 'n = 2' \
'while len(primes) < 15:' '    if all(n % p for p in primes):' '        primes.append(n)' '    n += 1' \
'print(*primes)' > primes.py && python3 primes.py`)
	if primes.Code != 0 || strings.TrimSpace(primes.stdout) != "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47" {
		t.Errorf("primes: exit %d, stdout %q, stderr %q", primes.Code, primes.stdout, primes.stderr)
	}

	who := run(t, sb, "whoami; pwd")
	lines := strings.Split(strings.TrimSpace(who.stdout), "\n")
	scratch := regexp.MustCompile(`^/tmp/ephemeral-run-[A-Za-z0-9]{6}/scratch$`)
	if who.Code != 0 || len(lines) != 2 || lines[0] != "worker" || !scratch.MatchString(lines[1]) {
		t.Errorf("whoami; pwd: exit %d, stdout %q", who.Code, who.stdout)
	}
	if len(lines) == 2 && lines[1] != sb.ScratchDir() {
		t.Errorf("pwd %q, but the guest reported scratch dir %q", lines[1], sb.ScratchDir())
	}

	curl := run(t, sb, "command -v curl && curl -sS -m 8 https://example.com")
	if curl.Code == 0 || !strings.Contains(curl.stderr, "Could not resolve host: example.com") {
		t.Errorf("curl: exit %d, stdout %q, stderr %q; want a resolve error", curl.Code, curl.stdout, curl.stderr)
	}

	proof := run(t, sb, `printf 'sandbox proof\n' > /tmp/proof.txt && ls -l /tmp/proof.txt`)
	if proof.Code != 0 || !regexp.MustCompile(`^-rw-r--r-- 1 worker worker 14 .* /tmp/proof.txt\n$`).MatchString(proof.stdout) {
		t.Errorf("proof: exit %d, stdout %q, stderr %q", proof.Code, proof.stdout, proof.stderr)
	}
}

// What one sandbox writes, anywhere it can, is gone in the next.
func TestNothingSurvives(t *testing.T) {
	m, _ := newManager(t)
	first := newSandbox(t, m)
	w := run(t, first, `printf secret > /tmp/proof.txt && printf secret > ~/.profile-canary && printf secret > ../canary && ls /tmp/proof.txt ~/.profile-canary`)
	if w.Code != 0 {
		t.Fatalf("write: exit %d, stderr %q", w.Code, w.stderr)
	}
	if err := first.Destroy(); err != nil {
		t.Fatal(err)
	}
	second := newSandbox(t, m)
	r := run(t, second, `ls /tmp/proof.txt ~/.profile-canary 2>&1; ls -d /tmp/ephemeral-run-*`)
	if strings.Contains(r.stdout, "secret") || !strings.Contains(r.stdout, "No such file") {
		t.Errorf("second sandbox sees the first one's files: %q", r.stdout)
	}
	if strings.Count(r.stdout, "/tmp/ephemeral-run-") != 1 || first.ScratchDir() == second.ScratchDir() {
		t.Errorf("scratch dirs: first %s, second %s, listing %q", first.ScratchDir(), second.ScratchDir(), r.stdout)
	}
}

func TestExitCodesAndSignals(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)

	for _, tc := range []struct {
		script string
		code   int
		signal int
	}{
		{"true", 0, 0},
		{"exit 3", 3, 0},
		{"exit 255", 255, 0},
		{"kill -KILL $$", -1, int(syscall.SIGKILL)},
		{"kill -TERM $$", -1, int(syscall.SIGTERM)},
	} {
		r := run(t, sb, tc.script)
		if r.Code != tc.code || r.Signal != tc.signal {
			t.Errorf("%q: code %d signal %d, want code %d signal %d", tc.script, r.Code, r.Signal, tc.code, tc.signal)
		}
	}

	r := runReq(t, sb, vsockproto.ExecRequest{Argv: []string{"no-such-command", "--flag"}, Timeout: time.Minute})
	if r.Code != 127 || !strings.Contains(r.stderr, "no-such-command") {
		t.Errorf("missing command: code %d, stderr %q; want 127 and a message naming it", r.Code, r.stderr)
	}
}

func TestHostSignal(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncBuffer
	p, err := sb.Start(ctx, vsockproto.ExecRequest{Shell: "echo started; exec sleep 1000"}, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(out.String(), "started") {
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if st.Signal != int(syscall.SIGTERM) {
		t.Errorf("after SIGTERM from the host: %+v", st)
	}
}

// A per-command timeout kills the whole process group, background children
// included.
func TestTimeoutKillsProcessGroup(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)
	r := runReq(t, sb, vsockproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 1000 & sleep 1000"}, Timeout: 2 * time.Second})
	if !r.TimedOut || r.Code == 0 {
		t.Errorf("status %+v, want timed out", r.ExitStatus)
	}
	left := run(t, sb, "pgrep -a sleep; echo done")
	if strings.TrimSpace(left.stdout) != "done" {
		t.Errorf("processes survived the timeout: %q", left.stdout)
	}
}

// 50 MiB of output passes through with host memory bounded far below that,
// and the kept output is capped and marked truncated.
func TestOutputFloodIsBounded(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)

	const flood = 50 << 20
	var peak uint64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	kept := vsockproto.NewCappedBuffer(1 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := sb.Exec(ctx, vsockproto.ExecRequest{Shell: fmt.Sprintf("head -c %d /dev/zero", flood), Timeout: 5 * time.Minute}, nil, kept, nil)
	close(stop)
	sampler.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 0 {
		t.Fatalf("exit %+v", st)
	}
	if !kept.Truncated() || kept.Total() != flood || len(kept.Bytes()) > 1<<20+256 {
		t.Errorf("kept %d of %d bytes, truncated=%v", len(kept.Bytes()), kept.Total(), kept.Truncated())
	}
	if peak > 32<<20 {
		t.Errorf("host heap peaked at %d MiB while passing %d MiB of output", peak>>20, flood>>20)
	}
	t.Logf("host heap peak %.1f MiB for %d MiB of output", float64(peak)/(1<<20), flood>>20)
}

// Output is bytes, not text: every byte value arrives unchanged.
func TestNonUTF8OutputIsByteExact(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)
	r := run(t, sb, `python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256))*3); sys.stderr.buffer.write(b"\xff\xfe\x00err\x80")'`)
	var want []byte
	for i := 0; i < 3; i++ {
		for b := 0; b < 256; b++ {
			want = append(want, byte(b))
		}
	}
	if r.Code != 0 || r.stdout != string(want) || r.stderr != "\xff\xfe\x00err\x80" {
		t.Errorf("exit %d, stdout %q, stderr %q", r.Code, r.stdout, r.stderr)
	}
}

func TestFiles(t *testing.T) {
	m, _ := newManager(t)
	sb := newSandbox(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	content := bytes.Repeat([]byte("data\x00\xff"), 100000)
	path := sb.ScratchDir() + "/input.bin"
	if err := sb.WriteFile(ctx, vsockproto.FileRequest{Path: path}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	r := run(t, sb, "stat -c '%U %s' input.bin && sha256sum input.bin | cut -c1-16")
	if !strings.HasPrefix(r.stdout, fmt.Sprintf("worker %d\n", len(content))) {
		t.Errorf("written file as seen in the guest: %q %q", r.stdout, r.stderr)
	}
	var back bytes.Buffer
	if err := sb.ReadFile(ctx, vsockproto.FileRequest{Path: path}, &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Bytes(), content) {
		t.Errorf("read back %d bytes, wrote %d", back.Len(), len(content))
	}
	if err := sb.ReadFile(ctx, vsockproto.FileRequest{Path: "/no/such/file"}, &back); err == nil {
		t.Error("reading a missing file succeeded")
	}
}

// Cancelling the context mid-boot leaves nothing behind (checked by
// newManager's cleanup).
func TestCancelDuringBoot(t *testing.T) {
	m, _ := newManager(t)
	for _, after := range []time.Duration{50 * time.Millisecond, 400 * time.Millisecond, 1500 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), after)
		sb, err := m.Create(ctx, sandbox.Options{})
		cancel()
		if err == nil {
			// The machine was faster than the deadline; that is fine too.
			sb.Destroy()
		}
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer = testenv.SyncBuffer
