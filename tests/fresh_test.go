package tests

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
)

// clockTolerance bounds how far a guest's clock may be from the host's
// right after the sandbox was created. It is a correctness bound, not a
// speed measurement: provisioning sets the clock to within the time one
// frame takes, while a guest that missed it is off by up to a second (a
// cold boot's RTC has whole seconds) or by the template's age (a clone).
const clockTolerance = 250 * time.Millisecond

// identityScript prints, one per line, everything a guest could compare
// with another sandbox's to tell that they are clones of one snapshot:
// fresh randomness from the kernel (its CRNG, and the batched randomness
// behind a new process's stack address), the boot id the kernel makes on
// first read, the names, the interface address, the scratch directory,
// and last the clock.
const identityScript = `head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo
python3 -c 'import random; print(random.getrandbits(64))'
grep -m1 '\[stack\]' /proc/self/maps | cut -d' ' -f1
cat /proc/sys/kernel/random/boot_id
hostname
cat /etc/machine-id
cat /sys/class/net/eth0/address
pwd
date +%s.%N`

var identityFields = []string{"urandom", "python random", "stack address", "boot id", "hostname", "machine id", "mac", "scratch dir"}

// Sandboxes restored from one template, taken from a pool or not, share
// nothing a guest could tell clones apart by, with each other or with a
// booted sandbox, and their clocks are the host's.
func TestRestoredSandboxesAreAsFreshAsBootedOnes(t *testing.T) {
	m, _ := newManager(t)
	pool := newPool(t, m, sandbox.PoolConfig{Size: 2}, 2)
	var sandboxes []*sandbox.Sandbox
	for _, start := range []sandbox.Start{sandbox.StartBoot, sandbox.StartRestore, sandbox.StartRestore, sandbox.StartRestore} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		sb, err := m.Create(ctx, sandbox.Options{Start: start})
		cancel()
		if err != nil {
			t.Fatalf("create sandbox: %v", err)
		}
		t.Cleanup(func() { sb.Destroy() })
		if restored := sb.Timings().Restored; restored != (start == sandbox.StartRestore) {
			t.Errorf("sandbox %s: restored = %v, asked for %v", sb.ID(), restored, start)
		}
		sandboxes = append(sandboxes, sb)
	}
	// The pooled ones waited, clones of the same template, for a while.
	for range 2 {
		sb := take(t, pool, sandbox.Options{})
		if !sb.Timings().Pooled || !sb.Timings().Restored {
			t.Errorf("sandbox %s: timings %+v, want a pooled clone", sb.ID(), sb.Timings())
		}
		sandboxes = append(sandboxes, sb)
	}

	seen := map[string]string{} // field value -> the sandbox that had it
	for _, sb := range sandboxes {
		name := sb.ID()
		switch t := sb.Timings(); {
		case t.Pooled:
			name += " (pooled)"
		case t.Restored:
			name += " (restored)"
		}

		before := time.Now()
		r := run(t, sb, identityScript)
		after := time.Now()
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.Code != 0 || len(lines) != len(identityFields)+1 {
			t.Fatalf("%s: identity script: exit %d, stdout %q, stderr %q", name, r.Code, r.stdout, r.stderr)
		}
		for j, field := range identityFields {
			value := field + " " + lines[j]
			if other, ok := seen[value]; ok {
				t.Errorf("%s has the same %s as %s: %s", name, field, other, lines[j])
			}
			seen[value] = name
		}
		if mac := lines[6]; mac != sb.Network().MAC().String() {
			t.Errorf("%s: guest MAC %s, the host gave it %s", name, mac, sb.Network().MAC())
		}
		if scratch := lines[7]; scratch != sb.ScratchDir() {
			t.Errorf("%s: pwd %s, the guest reported scratch dir %s", name, scratch, sb.ScratchDir())
		}
		assertClock(t, name, lines[8], before, after)
	}
}

// assertClock checks that the guest's `date +%s.%N`, taken between before
// and after on the host, agrees with the host's clock.
func assertClock(t *testing.T, name, guestDate string, before, after time.Time) {
	t.Helper()
	secs, err := strconv.ParseFloat(guestDate, 64)
	if err != nil {
		t.Errorf("%s: guest date %q: %v", name, guestDate, err)
		return
	}
	guest := time.Unix(0, int64(secs*1e9))
	if guest.Before(before.Add(-clockTolerance)) || guest.After(after.Add(clockTolerance)) {
		t.Errorf("%s: guest clock %s, host clock %s..%s: off by more than %v", name,
			guest.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano), clockTolerance)
	}
}
