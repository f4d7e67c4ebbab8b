package runs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.RunMain(m) }

// testNode is one daemon of a cluster, in this process: its own store
// connections, hub and service, on the shared database.
type testNode struct {
	name string
	st   *store.Store
	hub  *timeline.Hub
	svc  *Service
	stop func()
}

var nodeSeq atomic.Int64

func startNode(t *testing.T, url, name string, capacity int, lease time.Duration, exec executorFunc) *testNode {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	hub := timeline.NewHub()
	id := fmt.Sprintf("node_%016x", nodeSeq.Add(1))
	svc := New(st, hub, Config{Executor: exec, Rates: ledger.DefaultRates, MaxConcurrent: capacity, MaxActivePerOrg: 100,
		Cluster: &Cluster{NodeID: id, Hostname: name, Lease: lease}})
	if _, err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	serving, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		svc.Serve(serving, time.Hour)
	}()
	var once sync.Once
	n := &testNode{name: name, st: st, hub: hub, svc: svc}
	n.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			st.Close()
		})
	}
	t.Cleanup(n.stop)
	return n
}

// fundedOrg creates an organisation with $1.00 through st.
func fundedOrg(t *testing.T, st *store.Store) string {
	t.Helper()
	ctx := context.Background()
	o, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, o.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	return o.ID
}

func submit(t *testing.T, n *testNode, orgID string) store.Run {
	t.Helper()
	run, _, err := n.svc.Submit(context.Background(), Submission{
		Spec:      Spec{OrgID: orgID, Prompt: "p", Model: "m", Timeout: time.Minute, MaxCostMicros: 40000},
		Canonical: []byte(`{"prompt":"p"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// checkBalanced fails unless the organisation's account holds nothing and
// adds up.
func checkBalanced(t *testing.T, st *store.Store, orgID string) ledger.Account {
	t.Helper()
	a, err := st.Balance(context.Background(), orgID)
	if err != nil {
		t.Fatal(err)
	}
	if a.Held != 0 || a.Available+a.Held+a.Charged != a.Credited {
		t.Fatalf("account after the runs: %+v", a)
	}
	return a
}

// Runs created through one node are spread over the nodes by the queue,
// each executed exactly once.
func TestClusterSpreadsRunsAndRunsEachOnce(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	var mu sync.Mutex
	executed := map[string][]string{} // run → nodes
	execOn := func(name string) executorFunc {
		return func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
			mu.Lock()
			executed[spec.RunID] = append(executed[spec.RunID], name)
			mu.Unlock()
			time.Sleep(200 * time.Millisecond)
			return Result{Output: "done on " + name}, nil
		}
	}
	a := startNode(t, url, "a", 1, 5*time.Second, execOn("a"))
	b := startNode(t, url, "b", 1, 5*time.Second, execOn("b"))
	orgID := fundedOrg(t, a.st)
	var ids []string
	for range 6 {
		ids = append(ids, submit(t, a, orgID).ID)
	}
	nodes := map[string]int{}
	for _, id := range ids {
		r := waitEnded(t, b.st, b.hub, orgID, id)
		if r.Status != store.Succeeded {
			t.Fatalf("run %s: %s %s", id, r.Status, r.ErrorMessage)
		}
		mu.Lock()
		on := executed[id]
		mu.Unlock()
		if len(on) != 1 {
			t.Fatalf("run %s executed on %v, want exactly one node", id, on)
		}
		nodes[on[0]]++
	}
	if len(nodes) < 2 {
		t.Fatalf("runs per node %v: one node did all the work", nodes)
	}
	checkBalanced(t, a.st, orgID)
}

// A node that stops heartbeating loses its running runs: another node
// ends them node_lost after the lease, charging what was metered, and a
// job delivered again for such a run executes nothing.
func TestRunsOfALostNodeEndNodeLost(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	executed := make(chan string, 10)
	b := startNode(t, url, "b", 1, time.Second, func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
		executed <- spec.RunID
		return Result{}, nil
	})
	orgID := fundedOrg(t, b.st)

	// A node that ran one run, with some of it metered, and died.
	dead := store.Node{ID: "node_00000000deadbeef", Hostname: "dead", Capacity: 1, StartedAt: time.Now(), HeartbeatAt: time.Now()}
	if err := b.st.RegisterNode(ctx, dead); err != nil {
		t.Fatal(err)
	}
	run := queue(t, b.st, orgID, "")
	if ok, err := b.st.MarkRunning(ctx, run.ID, dead.ID, time.Now()); !ok || err != nil {
		t.Fatalf("mark running: %v %v", ok, err)
	}
	if err := b.st.RecordUsage(ctx, run.ID, ledger.Usage{ModelCalls: 1}, ledger.Cost{Model: 1234}); err != nil {
		t.Fatal(err)
	}
	diedAt := time.Now()

	ended := waitEnded(t, b.st, b.hub, orgID, run.ID)
	if ended.Status != store.Failed || ended.ErrorCode != "node_lost" || ended.Charged != 1234 {
		t.Fatalf("lost run: %s %s charged %d; want failed node_lost charged 1234", ended.Status, ended.ErrorCode, ended.Charged)
	}
	t.Logf("ended node_lost %v after the last heartbeat (lease 1s)", time.Since(diedAt).Round(time.Millisecond))
	events, err := b.st.Events(ctx, run.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-2]
	if last.Category != timeline.Failed || !strings.Contains(last.Message, "node_00000000deadbeef") {
		t.Fatalf("timeline does not say which node was lost: %+v", last)
	}
	checkBalanced(t, b.st, orgID)

	// River delivers the run's job again (rescued from the dead node):
	// nothing executes.
	if err := b.svc.work(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-executed:
		t.Fatalf("run %s executed again", id)
	default:
	}
}

// A job delivered for a run another node is running does nothing.
func TestAJobDeliveredTwiceRunsOnce(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	release := make(chan struct{})
	var runs atomic.Int64
	exec := func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
		runs.Add(1)
		<-release
		return Result{}, nil
	}
	a := startNode(t, url, "a", 1, 5*time.Second, exec)
	orgID := fundedOrg(t, a.st)
	run := submit(t, a, orgID)
	waitStatus(t, a, orgID, run.ID, store.Running)
	b := startNode(t, url, "b", 1, 5*time.Second, exec)
	if err := b.svc.work(context.Background(), run.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	if r := waitEnded(t, a.st, a.hub, orgID, run.ID); r.Status != store.Succeeded {
		t.Fatalf("run: %s %s", r.Status, r.ErrorMessage)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("executed %d times", n)
	}
}

// A cancel asked on node B stops the run node A executes, and a queued
// run is canceled where it is asked.
func TestCancelReachesTheExecutingNode(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	stoppedBy := make(chan error, 1)
	a := startNode(t, url, "a", 1, 5*time.Second, func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
		<-ctx.Done()
		stoppedBy <- context.Cause(ctx)
		return Result{}, ctx.Err()
	})
	orgID := fundedOrg(t, a.st)
	run := submit(t, a, orgID)
	waitStatus(t, a, orgID, run.ID, store.Running)
	b := startNode(t, url, "b", 1, 5*time.Second, func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
		return Result{}, errors.New("node b must not execute this run")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := b.svc.Cancel(ctx, orgID, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != store.Canceled {
		t.Fatalf("after cancel through node b: %s %s", got.Status, got.ErrorMessage)
	}
	if cause := <-stoppedBy; !errors.Is(cause, errCanceled) {
		t.Fatalf("node a's run stopped by %v", cause)
	}
	checkBalanced(t, a.st, orgID)
}

// A stream opened on node B follows, live, a run node A executes.
func TestFollowOnAnotherNodeIsLive(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	next := make(chan struct{})
	a := startNode(t, url, "a", 1, 5*time.Second, func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
		for i := 1; i <= 3; i++ {
			if err := rec.Event(timeline.Shell, fmt.Sprintf("step %d", i), nil); err != nil {
				return Result{}, err
			}
			// The next step waits until node B's stream has shown this one.
			select {
			case <-next:
			case <-ctx.Done():
				return Result{}, ctx.Err()
			}
		}
		return Result{Output: "ok"}, nil
	})
	orgID := fundedOrg(t, a.st)
	run := submit(t, a, orgID)
	// Node B starts once A has the run: its queue cannot take it.
	waitStatus(t, a, orgID, run.ID, store.Running)
	b := startNode(t, url, "b", 1, 5*time.Second, func(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
		return Result{}, errors.New("node b must not execute this run")
	})
	f := &stepFollower{next: next}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ended, err := b.svc.Follow(ctx, orgID, run.ID, 0, f)
	if err != nil {
		t.Fatal(err)
	}
	if ended.Status != store.Succeeded || f.steps != 3 {
		t.Fatalf("followed to %s with %d steps", ended.Status, f.steps)
	}
}

// stepFollower lets the executor go on each time it sees a step.
type stepFollower struct {
	next  chan struct{}
	steps int
}

func (f *stepFollower) Events(batch []store.Event) error {
	for _, e := range batch {
		if e.Category == timeline.Shell {
			f.steps++
			f.next <- struct{}{}
		}
	}
	return nil
}

func (f *stepFollower) Idle() error { return nil }

func waitStatus(t *testing.T, n *testNode, orgID, runID string, want store.Status) {
	t.Helper()
	giveUp := time.After(time.Minute)
	for {
		changed := n.hub.Changed(runID)
		r, err := n.st.GetRun(context.Background(), orgID, runID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == want {
			return
		}
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		case <-giveUp:
			t.Fatalf("run %s still %s after a minute, want %s", runID, r.Status, want)
		}
	}
}
