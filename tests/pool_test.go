package tests

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/netns"
)

// newPool starts a pool of m's and waits until it holds want sandboxes.
func newPool(t *testing.T, m *sandbox.Manager, cfg sandbox.PoolConfig, want int) *sandbox.Pool {
	t.Helper()
	p, err := m.NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	p.Start()
	waitReady(t, p, want)
	return p
}

// waitReady waits, for as long as starting VMs under TCG can take, until p
// holds want sandboxes.
func waitReady(t *testing.T, p *sandbox.Pool, want int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for p.Ready() != want {
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d sandboxes, want %d", p.Ready(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func take(t *testing.T, p *sandbox.Pool, opts sandbox.Options) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := p.Take(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy() })
	return sb
}

// A pool hands out each sandbox once, ready and sealed, refills within
// its capacity (taken sandboxes count), and leaves nothing when closed.
func TestPoolHandsOutEachSandboxOnce(t *testing.T) {
	m, _ := newManager(t)
	p := newPool(t, m, sandbox.PoolConfig{Size: 2, Capacity: 2}, 2)

	a := take(t, p, sandbox.Options{})
	if !a.Timings().Pooled {
		t.Error("the sandbox did not come from the pool")
	}
	if r := run(t, a, "whoami"); r.Code != 0 || r.stdout != "worker\n" {
		t.Errorf("pooled sandbox: whoami exit %d, %q", r.Code, r.stdout)
	}
	// a and the one left in the pool fill the capacity: no refill.
	if got := p.Ready(); got != 1 {
		t.Errorf("pool holds %d after a take, want 1", got)
	}
	b := take(t, p, sandbox.Options{})
	if b.ID() == a.ID() {
		t.Fatal("the pool handed out the same sandbox twice")
	}
	if err := a.Destroy(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 1) // a's place is free again

	// Another shape is not the pool's: it is started for the caller.
	other := take(t, p, sandbox.Options{MemoryMiB: 768})
	if other.Timings().Pooled {
		t.Error("a sandbox of another shape came from the pool")
	}
}

// A pooled sandbox is sealed until taken; a take that grants the broker
// opens exactly the broker's port.
func TestPoolSwitchesTakenSandboxToBrokerMode(t *testing.T) {
	m, _ := newManager(t)
	p := newPool(t, m, sandbox.PoolConfig{Size: 1}, 1)
	const port = 3128
	sb := take(t, p, sandbox.Options{
		Network: netns.Config{Mode: netns.Broker, BrokerPort: port},
		Env:     []string{"EPHEMERAL_CONNECTIONS_URL=http://10.77.0.1:3128/connections"},
	})
	if !sb.Timings().Pooled {
		t.Fatal("the sandbox did not come from the pool")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := sb.Network().Listen(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "broker %s", r.URL.Host)
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })

	r := run(t, sb, `curl -sS -m 5 http://example.com/; echo; echo "$EPHEMERAL_CONNECTIONS_URL"`)
	if r.Code != 0 || r.stdout != "broker example.com\nhttp://10.77.0.1:3128/connections\n" {
		t.Errorf("through the proxy variables: exit %d, stdout %q, stderr %q", r.Code, r.stdout, r.stderr)
	}
}
