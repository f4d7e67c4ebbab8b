package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for the fill and CREATE DATABASE
	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/store/storebench"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/internal/pgserver"
)

var benchQueueCommand = &cli.Command{
	Name:  "queue",
	Usage: "measure creating, queueing and settling runs on SQLite against PostgreSQL with one and several nodes, and print their ratios",
	Description: "Serves the API on loopback with runs that need no VM from three deployments at once: the embedded " +
		"SQLite database, one node on PostgreSQL, and --nodes nodes (daemons in this process, each with its own state " +
		"directory and port) sharing one PostgreSQL database, the requests spread over them in turn. It times " +
		"POST /v1/runs one at a time and from --clients clients at once, the time from sending the POST to the run's " +
		"executor being called (submit→start), and how many runs per second settle when --clients clients each create " +
		"a run, wait for its end and create the next, each run sleeping --sleep. The deployments take turns, so that " +
		"the machine's noise weighs on all alike, and each figure is printed with its ratio to the baseline measured " +
		"in the same run. Then it times the POSTs one at a time again on databases holding --history finished runs, " +
		"SQLite and PostgreSQL, and prints the largest history's ratio to the smallest. Without --postgres it starts " +
		"a throwaway PostgreSQL cluster (as the postgres user, so run it as root) and removes it at the end.",
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "runs", Value: 300, Usage: "runs created per deployment and measure"},
		&cli.IntSliceFlag{Name: "history", Value: cli.NewIntSlice(1_000, 20_000), Usage: "history sizes, in finished runs"},
		&cli.IntFlag{Name: "nodes", Value: 3, Usage: "nodes of the several-node PostgreSQL deployment"},
		&cli.IntFlag{Name: "clients", Value: 16, Usage: "concurrent clients of the throughput measures"},
		&cli.IntFlag{Name: "capacity", Value: 4, Usage: "runs each node executes at once (max-concurrent-runs)"},
		&cli.DurationFlag{Name: "sleep", Value: 5 * time.Millisecond, Usage: "how long each run takes in the settle measure"},
		&cli.StringFlag{Name: "postgres", Usage: "URL of a PostgreSQL database whose role may create databases: the bench " +
			"creates its own beside it and drops them at the end (default: a throwaway cluster)"},
		&cli.StringFlag{Name: "dir", Usage: "directory for the state directories and SQLite databases (default: the system's temporary directory); they are removed at the end"},
	},
	Action: func(c *cli.Context) error {
		b := queueBench{runs: c.Int("runs"), history: c.IntSlice("history"), nodes: c.Int("nodes"), clients: c.Int("clients"),
			capacity: c.Int("capacity"), sleep: c.Duration("sleep"), postgres: c.String("postgres"), dir: c.String("dir"),
			out: os.Stdout, log: os.Stderr}
		return b.run(c.Context)
	},
}

// queueBench measures how runs are created, queued and settled on each
// backend, and with one node against several.
type queueBench struct {
	runs     int
	history  []int
	nodes    int
	clients  int
	capacity int
	sleep    time.Duration
	postgres string
	dir      string
	out      io.Writer // the tables
	log      io.Writer // progress and details
}

// What is measured on the deployments without history, in the order the
// table prints.
var queueBenchRows = []string{
	"POST /v1/runs one at a time, p50",
	"POST /v1/runs one at a time, p90",
	"submit→start, idle queue, p50",
	"submit→start, idle queue, p90",
	"POST /v1/runs, concurrent clients, p50",
	"POST /v1/runs, concurrent clients, p90",
	"POST /v1/runs, concurrent clients, POSTs/s",
	"POST /v1/runs, concurrent clients, 500s retried",
	"settle, concurrent clients, runs/s",
	"settle, concurrent clients, 500s retried",
	"submit→start while settling, p50",
	"submit→start while settling, p90",
	"runs left running: their end not stored",
}

// What is measured on each backend with each history size.
var queueHistoryRows = []string{
	"SQLite: POST /v1/runs p50",
	"SQLite: POST /v1/runs p90",
	"SQLite: submit→start p50",
	"PostgreSQL: POST /v1/runs p50",
	"PostgreSQL: POST /v1/runs p90",
	"PostgreSQL: submit→start p50",
}

// perSecond marks the rows that are rates, counted the rows that count
// events; the others are latencies.
func perSecond(row string) bool { return strings.HasSuffix(row, "/s") }
func counted(row string) bool {
	return strings.HasSuffix(row, " retried") || strings.HasPrefix(row, "runs left running")
}

// queueRounds is how many turns each deployment takes in the throughput
// measures.
const queueRounds = 3

func (b queueBench) run(ctx context.Context) (err error) {
	switch {
	case b.runs < queueRounds:
		return cli.Exit(fmt.Sprintf("ephemeral bench queue: --runs %d: at least %d", b.runs, queueRounds), 2)
	case len(b.history) < 2:
		return cli.Exit("ephemeral bench queue: give at least two history sizes (--history)", 2)
	case b.nodes < 2:
		return cli.Exit("ephemeral bench queue: --nodes: at least 2", 2)
	case b.clients < 1 || b.capacity < 1 || b.sleep < 0:
		return cli.Exit("ephemeral bench queue: --clients and --capacity must be positive, --sleep not negative", 2)
	}
	for _, n := range b.history {
		if n < 1 {
			return cli.Exit(fmt.Sprintf("ephemeral bench queue: history of %d runs: at least 1", n), 2)
		}
	}
	root, err := os.MkdirTemp(b.dir, "ephemeral-bench-queue-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(root)) }()
	// Every node of a phase may fill its pool (store.postgresMaxConns and
	// River's): phase one runs 1+nodes nodes at once.
	pg, err := startBenchPostgres(ctx, b.postgres, 40*(b.nodes+2)+50, b.log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pg.close()) }()
	secret := make([]byte, 32)
	rand.Read(secret)
	b.dir = root

	results, err := b.measureBackends(ctx, pg, hex.EncodeToString(secret))
	if err != nil {
		return err
	}
	history, err := b.measureHistory(ctx, pg, hex.EncodeToString(secret))
	if err != nil {
		return err
	}
	return b.print(results, history)
}

// measureBackends measures every row of queueBenchRows on SQLite, one
// PostgreSQL node and several: results[row][deployment].
func (b queueBench) measureBackends(ctx context.Context, pg *benchPostgres, secret string) (_ map[string][]float64, err error) {
	var deps []*queueDeployment
	defer func() {
		for _, d := range deps {
			err = errors.Join(err, d.close())
		}
	}()
	for i, nodes := range []int{0, 1, b.nodes} {
		d, err := b.startDeployment(ctx, pg, secret, fmt.Sprint("phase1-", i), nodes, 0)
		if err != nil {
			return nil, err
		}
		deps = append(deps, d)
	}
	res := map[string][]float64{}
	set := func(row string, k int, v float64) {
		if res[row] == nil {
			res[row] = make([]float64, len(deps))
		}
		res[row][k] = v
	}

	fmt.Fprintf(b.log, "POST one at a time, %d each…\n", b.runs)
	posts, starts, err := oneAtATime(ctx, deps, b.runs)
	if err != nil {
		return nil, err
	}
	for k := range deps {
		set("POST /v1/runs one at a time, p50", k, millis(percentile(posts[k], 50)))
		set("POST /v1/runs one at a time, p90", k, millis(percentile(posts[k], 90)))
		set("submit→start, idle queue, p50", k, millis(percentile(starts[k], 50)))
		set("submit→start, idle queue, p90", k, millis(percentile(starts[k], 90)))
	}

	fmt.Fprintf(b.log, "POST from %d clients, %d each…\n", b.clients, b.runs)
	// POSTs answered 500 and sent again, counted per measure.
	retried := func(row string) {
		for k, d := range deps {
			set(row, k, float64(d.retried.Swap(0)))
		}
	}
	for _, d := range deps {
		d.retried.Store(0)
	}
	latencies, rates, err := concurrentPosts(ctx, deps, b.runs, b.clients)
	if err != nil {
		return nil, err
	}
	retried("POST /v1/runs, concurrent clients, 500s retried")
	for k := range deps {
		set("POST /v1/runs, concurrent clients, p50", k, millis(percentile(latencies[k], 50)))
		set("POST /v1/runs, concurrent clients, p90", k, millis(percentile(latencies[k], 90)))
		set("POST /v1/runs, concurrent clients, POSTs/s", k, rates[k])
	}

	fmt.Fprintf(b.log, "settle %d runs of %s from %d clients…\n", b.runs, b.sleep, b.clients)
	starts, rates, err = settle(ctx, deps, b.runs, b.clients, b.sleep)
	if err != nil {
		return nil, err
	}
	retried("settle, concurrent clients, 500s retried")
	for k := range deps {
		set("settle, concurrent clients, runs/s", k, rates[k])
		set("submit→start while settling, p50", k, millis(percentile(starts[k], 50)))
		set("submit→start while settling, p90", k, millis(percentile(starts[k], 90)))
	}
	for k, d := range deps {
		if err := d.checkSucceeded(ctx); err != nil {
			return nil, err
		}
		set("runs left running: their end not stored", k, float64(d.leftRunning()))
	}
	return res, nil
}

// measureHistory times POSTs one at a time on SQLite and on one PostgreSQL
// node holding each history size: results[row][size].
func (b queueBench) measureHistory(ctx context.Context, pg *benchPostgres, secret string) (_ map[string][]float64, err error) {
	var deps []*queueDeployment // SQLite and PostgreSQL of each size in turn
	defer func() {
		for _, d := range deps {
			err = errors.Join(err, d.close())
		}
	}()
	for _, n := range b.history {
		for _, nodes := range []int{0, 1} {
			d, err := b.startDeployment(ctx, pg, secret, fmt.Sprint("history-", n), nodes, n)
			if err != nil {
				return nil, err
			}
			deps = append(deps, d)
		}
	}
	fmt.Fprintf(b.log, "POST one at a time on each history, %d each…\n", b.runs)
	posts, starts, err := oneAtATime(ctx, deps, b.runs)
	if err != nil {
		return nil, err
	}
	for _, d := range deps {
		if err := d.checkSucceeded(ctx); err != nil {
			return nil, err
		}
	}
	res := map[string][]float64{}
	for i := range b.history {
		for backend, prefix := range []string{"SQLite: ", "PostgreSQL: "} {
			k := 2*i + backend
			for _, m := range []struct {
				row string
				v   float64
			}{
				{"POST /v1/runs p50", millis(percentile(posts[k], 50))},
				{"POST /v1/runs p90", millis(percentile(posts[k], 90))},
				{"submit→start p50", millis(percentile(starts[k], 50))},
			} {
				res[prefix+m.row] = append(res[prefix+m.row], m.v)
			}
		}
	}
	return res, nil
}

func (b queueBench) print(results, history map[string][]float64) error {
	fmt.Fprintf(b.out, "%d runs per deployment and measure; %d concurrent clients; %d runs at once per node; settling runs take %s\n\n",
		b.runs, b.clients, b.capacity, b.sleep)
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "no history\t%12s\t%12s\t%12s\t%9s\t%9s\n", "SQLite", "PG 1 node", fmt.Sprintf("PG %d nodes", b.nodes),
		"PG/SQLite", fmt.Sprintf("%d nodes/1", b.nodes))
	for _, row := range queueBenchRows {
		v := results[row]
		fmt.Fprintf(w, "%s\t%12s\t%12s\t%12s\t%9s\t%9s\n", row, queueValue(row, v[0]), queueValue(row, v[1]),
			queueValue(row, v[2]), queueRatio(row, v[1], v[0]), queueRatio(row, v[2], v[1]))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(b.out)
	first, last := b.history[0], b.history[len(b.history)-1]
	fmt.Fprint(w, "with a history of")
	for _, n := range b.history {
		fmt.Fprintf(w, "\t%12s", count(n)+" runs")
	}
	fmt.Fprintf(w, "\t%9s\n", count(last)+"/"+count(first))
	for _, row := range queueHistoryRows {
		v := history[row]
		fmt.Fprint(w, row)
		for _, x := range v {
			fmt.Fprintf(w, "\t%12s", queueValue(row, x))
		}
		fmt.Fprintf(w, "\t%9s\n", queueRatio(row, v[len(v)-1], v[0]))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(b.out, `
PG/SQLite: one PostgreSQL node's figure divided by SQLite's; %[1]d nodes/1: %[1]d nodes' divided by one node's.
For latencies below 1 is faster; for the /s rows (throughput) above 1 is more.
submit→start: from sending the POST to the executor being called: the commit, and on PostgreSQL River's fetch of the job.
Concurrent clients POST without waiting for the runs; settling clients each wait (event stream) for their run's end before the next.
500s retried: POSTs the daemon answered 500 (internal error), sent again with the same Idempotency-Key; their time counts from the first.
runs left running: runs still running %[4]s after their executor returned: the daemon failed to store their end (see its log).
%[2]s/%[3]s: the figure with %[2]s finished runs in the database divided by that with %[3]s: 1 means the history costs nothing.
`, b.nodes, count(last), count(first), queueStuckAfter)
	return err
}

// queueRatio is x/y, or a dash for counts, which are not compared.
func queueRatio(row string, x, y float64) string {
	if counted(row) {
		return "—"
	}
	return fmt.Sprintf("%.2f", x/y)
}

func queueValue(row string, v float64) string {
	if counted(row) {
		return fmt.Sprintf("%.0f", v)
	}
	if perSecond(row) {
		return fmt.Sprintf("%.1f/s", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

// oneAtATime creates n runs on each deployment, one request at a time and
// one deployment after another (the order rotating), each run waited for
// (untimed) before the next request. It returns each deployment's POST
// latencies and times from submit to start.
func oneAtATime(ctx context.Context, deps []*queueDeployment, n int) (posts, starts [][]time.Duration, err error) {
	posts, starts = make([][]time.Duration, len(deps)), make([][]time.Duration, len(deps))
	for i := range n {
		for j := range deps {
			k := (i + j) % len(deps)
			d := deps[k]
			r, err := d.submit(ctx)
			if err != nil {
				return nil, nil, err
			}
			start, err := d.waitStarted(ctx, r)
			if err != nil {
				return nil, nil, err
			}
			posts[k] = append(posts[k], r.took)
			starts[k] = append(starts[k], start)
		}
	}
	return posts, starts, nil
}

// concurrentPosts creates n runs on each deployment from clients clients
// at once, without waiting for them, in queueRounds turns; between turns
// the runs are left to end (untimed). It returns each deployment's POST
// latencies and POSTs per second.
func concurrentPosts(ctx context.Context, deps []*queueDeployment, n, clients int) ([][]time.Duration, []float64, error) {
	latencies := make([][]time.Duration, len(deps))
	took := make([]time.Duration, len(deps))
	for round := range queueRounds {
		m := n*(round+1)/queueRounds - n*round/queueRounds
		for j := range deps {
			k := (round + j) % len(deps)
			d := deps[k]
			var mu sync.Mutex
			var next atomic.Int64
			began := time.Now()
			g, gctx := errgroup.WithContext(ctx)
			for range clients {
				g.Go(func() error {
					for next.Add(1) <= int64(m) {
						r, err := d.submit(gctx)
						if err != nil {
							return err
						}
						mu.Lock()
						latencies[k] = append(latencies[k], r.took)
						mu.Unlock()
					}
					return nil
				})
			}
			if err := g.Wait(); err != nil {
				return nil, nil, err
			}
			took[k] += time.Since(began)
			if err := d.waitIdle(ctx); err != nil {
				return nil, nil, err
			}
		}
	}
	rates := make([]float64, len(deps))
	for k := range deps {
		rates[k] = float64(len(latencies[k])) / took[k].Seconds()
	}
	return latencies, rates, nil
}

// settle has clients clients each create a run, wait for its end and
// create the next, until n runs have ended on each deployment, in
// queueRounds turns; the runs take sleep each. It returns each
// deployment's times from submit to start and runs settled per second.
func settle(ctx context.Context, deps []*queueDeployment, n, clients int, sleep time.Duration) ([][]time.Duration, []float64, error) {
	for _, d := range deps {
		d.exec.sleep.Store(int64(sleep))
	}
	defer func() {
		for _, d := range deps {
			d.exec.sleep.Store(0)
		}
	}()
	starts := make([][]time.Duration, len(deps))
	took := make([]time.Duration, len(deps))
	for round := range queueRounds {
		m := n*(round+1)/queueRounds - n*round/queueRounds
		for j := range deps {
			k := (round + j) % len(deps)
			d := deps[k]
			var mu sync.Mutex
			var next atomic.Int64
			began := time.Now()
			g, gctx := errgroup.WithContext(ctx)
			for range clients {
				g.Go(func() error {
					for next.Add(1) <= int64(m) {
						r, err := d.submit(gctx)
						if err != nil {
							return err
						}
						start, err := d.waitStarted(gctx, r)
						if err != nil {
							return err
						}
						mu.Lock()
						starts[k] = append(starts[k], start)
						mu.Unlock()
					}
					return nil
				})
			}
			if err := g.Wait(); err != nil {
				return nil, nil, err
			}
			took[k] += time.Since(began)
		}
	}
	rates := make([]float64, len(deps))
	for k := range deps {
		rates[k] = float64(len(starts[k])) / took[k].Seconds()
	}
	return starts, rates, nil
}

// queueExecutor is the bench's executor: no VM, the run sleeps as long as
// it is told (nothing at first) and succeeds. It notes when each run was
// handed to it, whichever node of its deployment did.
type queueExecutor struct {
	sleep    atomic.Int64 // nanoseconds
	mu       sync.Mutex
	started  map[string]time.Time
	returned map[string]time.Time
}

func (e *queueExecutor) Execute(ctx context.Context, spec runs.Spec, _ *runs.Recorder) (runs.Result, error) {
	now := time.Now()
	e.mu.Lock()
	if _, ok := e.started[spec.RunID]; !ok {
		e.started[spec.RunID] = now
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.returned[spec.RunID] = time.Now()
		e.mu.Unlock()
	}()
	if d := time.Duration(e.sleep.Load()); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return runs.Result{}, context.Cause(ctx)
		}
	}
	return runs.Result{Output: "done"}, nil
}

// queueStuckAfter is how long after its executor returned a run that has
// not ended is taken to be left running: the runs service could not store
// its end (store.FinishRun failed) and will not try again.
const queueStuckAfter = 5 * time.Second

// stuck reports whether the run's executor returned more than
// queueStuckAfter ago.
func (e *queueExecutor) stuck(runID string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.returned[runID]
	return ok && time.Since(t) > queueStuckAfter
}

func (e *queueExecutor) startedAt(runID string) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.started[runID]
	return t, ok
}

// queueDeployment is one or more daemons sharing a database, each serving
// the API on loopback; requests go to each node in turn.
type queueDeployment struct {
	name    string
	history int // finished runs in the database before the bench's
	nodes   []*queueNode
	exec    *queueExecutor
	store   *store.Store // the first node's
	key     string
	http    *http.Client
	logged  *queueLog
	next    atomic.Uint64
	posted  atomic.Int64
	// retried counts the POSTs answered 500 and sent again.
	retried atomic.Int64
	// stuck are the runs left running after their executor returned.
	mu    sync.Mutex
	stuck map[string]bool
}

type queueNode struct {
	sys    *system.System
	srv    *http.Server
	served chan error
	base   string
}

// queueCreated is a run the bench created.
type queueCreated struct {
	id    string
	node  *queueNode
	began time.Time // when the POST was sent
	took  time.Duration
}

// startDeployment makes a database (SQLite when nodes is 0, else on pg)
// holding history finished runs and serves it with its nodes (one for
// SQLite).
func (b queueBench) startDeployment(ctx context.Context, pg *benchPostgres, secret, label string, nodes, history int) (_ *queueDeployment, err error) {
	d := &queueDeployment{history: history, exec: &queueExecutor{started: map[string]time.Time{}, returned: map[string]time.Time{}},
		stuck: map[string]bool{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.close())
		}
	}()
	cfg := config.Defaults()
	// The default model must be usable for runs to be accepted; the
	// executor never calls it.
	cfg.OpenAIBaseURL, cfg.DefaultModel = "http://127.0.0.1:9/v1", "openai/gpt-6-luna"
	cfg.SecretKey = secret
	cfg.MaxConcurrentRuns = b.capacity
	// Neither the organisation's cap nor the API's abuse limits may answer
	// a client that sends as fast as it can.
	cfg.MaxActiveRunsPerOrg = 1_000_000
	cfg.LimitKeyRunCreations, cfg.LimitKeyReads, cfg.LimitKeyStreams = 1_000_000, 1_000_000, 1_000_000
	cfg.LimitAddressRunCreations, cfg.LimitAddressReads, cfg.LimitAddressStreams = 1_000_000, 1_000_000, 1_000_000

	var key, sqlitePath string
	began := time.Now()
	if nodes == 0 {
		d.name = "SQLite"
		sqlitePath = filepath.Join(b.dir, label+"-sqlite.db")
		if key, err = sqliteHistory(ctx, sqlitePath, history, cfg.Retention); err != nil {
			return d, fmt.Errorf("%s: %w", d.name, err)
		}
		nodes = 1
	} else {
		d.name = fmt.Sprintf("PostgreSQL, %d node(s)", nodes)
		if cfg.Database, err = pg.newDatabase(ctx, label); err != nil {
			return d, err
		}
		if key, err = postgresHistory(ctx, cfg.Database, history, cfg.Retention); err != nil {
			return d, fmt.Errorf("%s: %w", d.name, err)
		}
	}
	if history > 0 {
		fmt.Fprintf(b.log, "%s: %s finished runs written in %.1f s\n", d.name, count(history), time.Since(began).Seconds())
		d.name += fmt.Sprintf(", history of %s runs", count(history))
	}
	d.key, d.http = key, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * b.clients}, Timeout: time.Minute}
	d.logged = newQueueLog(b.log)
	for i := range nodes {
		cfg := cfg
		cfg.StateDir = filepath.Join(b.dir, fmt.Sprintf("%s-node%d", label, i))
		if cfg.Database == "" {
			cfg.StateDir = filepath.Join(b.dir, label+"-sqlite")
		}
		n := &queueNode{}
		n.sys, err = system.New(ctx, cfg, system.Options{
			Database:  sqlitePath, // empty on PostgreSQL: cfg.Database
			Executor:  d.exec,
			Reconcile: func(context.Context, []string) error { return nil },
			Logger:    slog.New(d.logged).With("deployment", d.name),
		})
		if err != nil {
			return d, fmt.Errorf("%s: %w", d.name, err)
		}
		d.nodes = append(d.nodes, n)
		if err := n.sys.Start(ctx); err != nil {
			return d, fmt.Errorf("%s: %w", d.name, err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return d, err
		}
		n.srv = &http.Server{Handler: n.sys.API.Handler()}
		n.served = make(chan error, 1)
		go func() { n.served <- n.srv.Serve(ln) }()
		n.base = "http://" + ln.Addr().String()
	}
	d.store = d.nodes[0].sys.Store
	return d, nil
}

// queuePostAttempts bounds how often one POST answered 500 is sent again.
const queuePostAttempts = 20

// submit sends one POST /v1/runs to the next node. An answer 500 says the
// request may be retried: it is, with the same Idempotency-Key, and the
// time it took counts from the first attempt.
func (d *queueDeployment) submit(ctx context.Context) (queueCreated, error) {
	n := d.nodes[(d.next.Add(1)-1)%uint64(len(d.nodes))]
	body := `{"prompt":"benchmark run","shell":true,"timeout_seconds":120,"max_cost_micros":40000}`
	key := fmt.Sprint("bench-queue-", d.posted.Add(1))
	began := time.Now()
	for attempt := 1; ; attempt++ {
		status, created, err := d.request(ctx, "POST", n.base+"/v1/runs", body, "Idempotency-Key", key, "Content-Type", "application/json")
		if err != nil {
			return queueCreated{}, err
		}
		if status == http.StatusInternalServerError && attempt < queuePostAttempts {
			d.retried.Add(1)
			continue
		}
		if status != http.StatusCreated {
			return queueCreated{}, fmt.Errorf("%s: POST /v1/runs (attempt %d): %d %s", d.name, attempt, status, created)
		}
		took := time.Since(began)
		var run struct{ ID string }
		if err := json.Unmarshal(created, &run); err != nil || run.ID == "" {
			return queueCreated{}, fmt.Errorf("%s: POST /v1/runs answered %s", d.name, created)
		}
		return queueCreated{id: run.ID, node: n, began: began, took: took}, nil
	}
}

// waitStarted waits, on the node that created it, for the run's end (its
// event stream ends then) and returns how long after the POST was sent
// the executor got it. A run left running after its executor returned
// (see queueStuckAfter) is noted and waited for no longer.
func (d *queueDeployment) waitStarted(ctx context.Context, r queueCreated) (time.Duration, error) {
	streaming, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	go func() {
		status, body, err := d.request(streaming, "GET", r.node.base+"/v1/runs/"+r.id+"/events", "", "Accept", "text/event-stream")
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("%s: GET /v1/runs/%s/events: %d %s", d.name, r.id, status, body)
		}
		ended <- err
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case err := <-ended:
			if err != nil {
				return 0, err
			}
			waiting = false
		case <-tick.C:
			if d.exec.stuck(r.id) {
				d.mu.Lock()
				d.stuck[r.id] = true
				d.mu.Unlock()
				waiting = false
			}
		}
	}
	start, ok := d.exec.startedAt(r.id)
	if !ok {
		return 0, fmt.Errorf("%s: run %s ended without being executed", d.name, r.id)
	}
	return start.Sub(r.began), nil
}

// leftRunning is how many runs were left running after their executor
// returned.
func (d *queueDeployment) leftRunning() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.stuck)
}

// request sends one request as the bench's organisation and reads the
// whole answer.
func (d *queueDeployment) request(ctx context.Context, method, url, body string, headers ...string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", d.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %s %s: %w", d.name, method, url, err)
	}
	return resp.StatusCode, b, nil
}

// waitIdle waits until no run is queued or running, but those left
// running after their executor returned (see queueStuckAfter), which it
// notes.
func (d *queueDeployment) waitIdle(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		active, err := d.store.ActiveRuns(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		waiting := 0
		for _, r := range active {
			if d.exec.stuck(r.ID) {
				d.mu.Lock()
				d.stuck[r.ID] = true
				d.mu.Unlock()
			} else {
				waiting++
			}
		}
		if waiting == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d runs still active after 2 minutes", d.name, waiting)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkSucceeded fails unless every run the bench created has succeeded
// (a run that failed would have been timed as if it had worked) or was
// left running.
func (d *queueDeployment) checkSucceeded(ctx context.Context) error {
	if err := d.waitIdle(ctx); err != nil {
		return err
	}
	totals, err := d.store.Totals(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", d.name, err)
	}
	left := int64(d.leftRunning())
	want := map[store.Status]int64{store.Succeeded: int64(d.history) + d.posted.Load() - left, store.Running: left}
	for _, st := range store.Statuses {
		if totals.RunsByStatus[st] != want[st] {
			return fmt.Errorf("%s: runs by status %v, want %v", d.name, totals.RunsByStatus, want)
		}
	}
	return nil
}

// close stops serving and closes every node.
func (d *queueDeployment) close() error {
	if d.logged != nil {
		if s := d.logged.summary(); s != "" {
			fmt.Fprintf(d.logged.w, "%s: the daemons logged %s\n", d.name, s)
		}
	}
	var errs []error
	for _, n := range d.nodes {
		if n.srv != nil {
			n.srv.Close()
			if err := <-n.served; !errors.Is(err, http.ErrServerClosed) {
				errs = append(errs, err)
			}
		}
	}
	for _, n := range d.nodes {
		errs = append(errs, n.sys.Close())
	}
	d.nodes = nil
	return errors.Join(errs...)
}

// newQueueOrg creates the organisation the bench's requests come from,
// with its member, API key and credit for any number of runs, and returns
// the key.
func newQueueOrg(ctx context.Context, st *store.Store) (orgID, key string, err error) {
	org, err := st.CreateOrg(ctx, "busy")
	if err != nil {
		return "", "", err
	}
	m, err := st.AddMember(ctx, org.ID, "dev@busy.example")
	if err != nil {
		return "", "", err
	}
	k := auth.NewKey()
	if err := st.AddKey(ctx, m, k.ID, k.Hash); err != nil {
		return "", "", err
	}
	if _, err := st.Credit(ctx, org.ID, 1<<50); err != nil {
		return "", "", err
	}
	return org.ID, k.Secret, nil
}

// sqliteHistory creates the SQLite database at path with the bench's
// organisation and n finished runs (storebench's, with a recording of one
// model turn) and returns the API key.
func sqliteHistory(ctx context.Context, path string, n int, retention time.Duration) (string, error) {
	if n == 0 {
		st, err := store.Open(ctx, path)
		if err != nil {
			return "", err
		}
		_, key, err := newQueueOrg(ctx, st)
		return key, errors.Join(err, st.Close())
	}
	p, err := storebench.Populate(ctx, path, storebench.History{Runs: n, EventsPerRun: queueEventsPerRun,
		RecordingBytes: 1, Retention: retention, Now: time.Now()})
	return p.APIKey, err
}

// The money and timeline of every run of a PostgreSQL history: those of
// storebench's.
const (
	queueReserved     = 40_000
	queueCharged      = 3_530
	queueEventsPerRun = 12
)

// postgresHistory creates the bench's organisation in the PostgreSQL
// database at databaseURL (which it migrates) and, with SQL that makes the
// rows in bulk, n finished runs as the runs service leaves them: the run,
// its 12 timeline entries, one recorded model turn, its three ledger
// entries, the account charged and the finished-run totals counted. It
// returns the API key.
func postgresHistory(ctx context.Context, databaseURL string, n int, retention time.Duration) (string, error) {
	st, err := store.OpenPostgres(ctx, databaseURL)
	if err != nil {
		return "", err
	}
	orgID, key, err := newQueueOrg(ctx, st)
	if err != nil || n == 0 {
		return key, errors.Join(err, st.Close())
	}
	defer st.Close()
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return "", err
	}
	defer db.Close()

	// As storebench places them: created evenly over the retention up to
	// an hour ago, finished 16 s later, the idempotency key kept for a
	// day, retention ending a day or more from now.
	now := time.Now()
	span := retention - time.Hour
	step := span.Milliseconds() / int64(n)
	first := now.Add(-time.Hour - span).UnixMilli()
	var seqs, contents []int64
	var categories, messages, data []string
	for i, e := range queueTimeline() {
		seqs = append(seqs, int64(i+1))
		categories, messages, data = append(categories, e[0]), append(messages, e[1]), append(data, e[2])
		var content int64
		if e[3] != "" {
			content = 1
		}
		contents = append(contents, content)
	}
	prompt := "This is a sandbox test. Do these steps with the shell and report the real output, never what you expect."
	request := `{"prompt":"` + prompt + `","shell":true,"web":false,"timeout_seconds":120,"max_cost_micros":40000}`
	turn := `{"turn":1,"kept_messages":1,"messages":[{"role":"tool","text":"` + strings.Repeat("primes 2 3 5 7 11 13 ", 200) +
		`"}],"response":{"text":"` + prompt + `"}}`
	statements := []struct {
		what string
		sql  string
		args []any
	}{
		{"runs", `INSERT INTO runs (id, org_id, idempotency_key, request_hash, request, model, zero_retention, timeout_seconds,
			status, created_at, started_at, finished_at, reserved, charged, released, model_micros, compute_micros, model_calls,
			input_tokens, output_tokens, shell_commands, vm_millis, output, retention_until)
			SELECT 'run_' || lpad(to_hex(i), 32, '0'), $1::text, CASE WHEN c > $4::bigint THEN 'bench-' || i END,
				decode(md5(i::text), 'hex'), $5::text, 'openai/gpt-6-luna', 0, 120, 'succeeded', c, c + 2420, c + 16000,
				$6::bigint, $7::bigint, $6::bigint - $7::bigint, 330, 3200, 3, 4800, 414, 4, 13333, '2 3 5 7 11 13 17 19 23 29 31 37 41 43 47', $8::bigint + i * $3::bigint
			FROM (SELECT i, $2::bigint + i * $3::bigint AS c FROM generate_series(0, $9::bigint - 1) AS i) AS s ORDER BY i`,
			[]any{orgID, first, step, now.Add(-24 * time.Hour).UnixMilli(), request, queueReserved, queueCharged,
				now.Add(24 * time.Hour).UnixMilli(), n}},
		{"timelines", `INSERT INTO events (run_id, seq, rev, t_millis, category, message, data, content)
			SELECT r.id, e.seq, e.seq, (e.seq - 1) * 1300, e.category, e.message, nullif(e.data, ''), e.content
			FROM runs AS r, unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[]) AS e (seq, category, message, data, content)
			WHERE r.org_id = $1 ORDER BY r.seq, e.seq`,
			[]any{orgID, seqs, categories, messages, data, contents}},
		{"recordings", `INSERT INTO recording_exchanges (run_id, turn, data) SELECT id, 1, $2 FROM runs WHERE org_id = $1`,
			[]any{orgID, turn}},
		{"ledger", `INSERT INTO ledger_entries (org_id, run_id, kind, micros, created_at)
			SELECT $1, r.id, k.kind, k.micros, CASE k.kind WHEN 'hold' THEN r.created_at ELSE r.finished_at END
			FROM runs AS r, (VALUES (1, 'hold', $2::bigint), (2, 'charge', $3::bigint), (3, 'release', $2::bigint - $3::bigint)) AS k (o, kind, micros)
			WHERE r.org_id = $1 ORDER BY r.seq, k.o`,
			[]any{orgID, queueReserved, queueCharged}},
		{"account", `UPDATE accounts SET available = available - $2, charged = charged + $2 WHERE org_id = $1`,
			[]any{orgID, int64(n) * queueCharged}},
		{"totals", `INSERT INTO finished_run_totals (status, runs, charged_micros) VALUES ('succeeded', $1, $2)
			ON CONFLICT (status) DO UPDATE SET runs = finished_run_totals.runs + excluded.runs,
				charged_micros = finished_run_totals.charged_micros + excluded.charged_micros`,
			[]any{n, int64(n) * queueCharged}},
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	for _, s := range statements {
		if _, err := tx.ExecContext(ctx, s.sql, s.args...); err != nil {
			return "", fmt.Errorf("write the history's %s: %w", s.what, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return "", err
	}
	// Statistics, as autovacuum would have gathered them on a database
	// that grew to this size.
	if _, err := db.ExecContext(ctx, `VACUUM ANALYZE`); err != nil {
		return "", err
	}
	// What was written reads back through the store as finished runs with
	// the money conserved.
	totals, err := st.Totals(ctx)
	if err != nil {
		return "", err
	}
	account, err := st.Balance(ctx, orgID)
	if err != nil {
		return "", err
	}
	if totals.RunsByStatus[store.Succeeded] != int64(n) || account.Held != 0 ||
		account.Available+account.Held+account.Charged != account.Credited || account.Charged != totals.Charged {
		return "", fmt.Errorf("the history reads back as %+v, account %+v", totals, account)
	}
	return key, nil
}

// queueTimeline is a populated run's timeline (category, message, data,
// and non-empty when the entry is user content): storebench's with 12
// entries.
func queueTimeline() [][4]string {
	out := [][4]string{
		{timeline.Queued, timeline.Reserved(queueReserved), `{"reserved_micros":40000}`, ""},
		{timeline.MicroVM, timeline.MicroVMReady, "", ""},
		{timeline.MicroVM, timeline.WorkerStarted(true, false), "", ""},
	}
	for len(out) < queueEventsPerRun-3 {
		out = append(out, [4]string{timeline.Shell, timeline.Command("python3 primes.py"),
			`{"state":"done","exit_code":0,"duration_ms":230,"output":"2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\n"}`, "content"})
	}
	return append(out,
		[4]string{timeline.MicroVM, timeline.MicroVMDestroyed, "", ""},
		[4]string{timeline.Successful, timeline.ModelSummary(3, 5214), `{"status":"succeeded","model_calls":3,"tokens":5214}`, ""},
		[4]string{timeline.WorkerDestroyed, timeline.Settled(queueCharged, queueReserved-queueCharged),
			`{"charged_micros":3530,"released_micros":36470}`, ""})
}

// benchPostgres is the PostgreSQL server the bench makes its databases
// on: a throwaway cluster of its own (internal/pgserver, listening only on
// a Unix socket in its directory) or the server of the --postgres URL.
type benchPostgres struct {
	adminURL string
	admin    *sql.DB
	created  []string // databases, dropped at the end on a server of the user's
	seq      int
	cluster  *pgserver.Server // nil on a server of the user's
}

// startBenchPostgres connects to the server of databaseURL or, when it is
// empty, starts a throwaway cluster allowing maxConns connections.
// Commits on it are durable as the daemon's SQLite ones are (WAL,
// synchronous=NORMAL): written at once, flushed to disk within a fraction
// of a second (synchronous_commit off); fsync stays on.
func startBenchPostgres(ctx context.Context, databaseURL string, maxConns int, log io.Writer) (_ *benchPostgres, err error) {
	p := &benchPostgres{adminURL: databaseURL}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	if databaseURL == "" {
		began := time.Now()
		p.cluster, err = pgserver.Start(pgserver.Options{MaxConnections: maxConns})
		switch {
		case errors.Is(err, pgserver.ErrNotInstalled):
			return p, fmt.Errorf("postgres: %w: run `sudo tools/install-deps.sh`, or give a server with --postgres", err)
		case errors.Is(err, pgserver.ErrNotPermitted):
			return p, fmt.Errorf("postgres: %w: run as root, or give a server with --postgres", err)
		case err != nil:
			return p, fmt.Errorf("postgres: %w", err)
		}
		p.adminURL = p.cluster.AdminURL()
		fmt.Fprintf(log, "a throwaway PostgreSQL cluster started in %s (%.1f s)\n", p.cluster.Dir(), time.Since(began).Seconds())
	}
	if p.admin, err = sql.Open("pgx", p.adminURL); err != nil {
		return p, fmt.Errorf("postgres: %w", err)
	}
	if err := p.admin.PingContext(ctx); err != nil {
		return p, fmt.Errorf("postgres: connect to %s: %w", store.RedactURL(p.adminURL), err)
	}
	return p, nil
}

// newDatabase creates an empty database and returns its URL.
func (p *benchPostgres) newDatabase(ctx context.Context, label string) (string, error) {
	p.seq++
	name := fmt.Sprintf("ephemeral_bench_queue_%d_%d_%s", os.Getpid(), p.seq, strings.ReplaceAll(label, "-", "_"))
	if _, err := p.admin.ExecContext(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
		return "", fmt.Errorf("postgres: create database %s: %w", name, err)
	}
	p.created = append(p.created, name)
	u, err := url.Parse(p.adminURL)
	if err != nil {
		return "", fmt.Errorf("postgres: parse %s: %w", store.RedactURL(p.adminURL), err)
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String(), nil
}

// close drops the databases made on a server of the user's, or stops the
// throwaway cluster and removes its directory.
func (p *benchPostgres) close() error {
	var errs []error
	if p.admin != nil {
		if p.cluster == nil {
			for _, name := range p.created {
				if _, err := p.admin.Exec(`DROP DATABASE "` + name + `" WITH (FORCE)`); err != nil {
					errs = append(errs, fmt.Errorf("postgres: drop database %s: %w", name, err))
				}
			}
		}
		errs = append(errs, p.admin.Close())
	}
	if p.cluster != nil {
		errs = append(errs, p.cluster.Stop())
	}
	return errors.Join(errs...)
}

// queueLog is the daemons' log: warnings and errors, the first few of each
// message written out, all of them counted, so that a flood of one error
// is summed up rather than printed.
type queueLog struct {
	w      io.Writer
	inner  slog.Handler
	counts *queueLogCounts
}

type queueLogCounts struct {
	mu    sync.Mutex
	n     map[string]int
	order []string
}

// queueLogShown is how many records of each message are written out.
const queueLogShown = 3

func newQueueLog(w io.Writer) *queueLog {
	return &queueLog{w: w, inner: slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}),
		counts: &queueLogCounts{n: map[string]int{}}}
}

func (h *queueLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *queueLog) Handle(ctx context.Context, r slog.Record) error {
	c := h.counts
	c.mu.Lock()
	if c.n[r.Message] == 0 {
		c.order = append(c.order, r.Message)
	}
	c.n[r.Message]++
	n := c.n[r.Message]
	c.mu.Unlock()
	if n > queueLogShown {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

func (h *queueLog) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &queueLog{w: h.w, inner: h.inner.WithAttrs(attrs), counts: h.counts}
}

func (h *queueLog) WithGroup(name string) slog.Handler {
	return &queueLog{w: h.w, inner: h.inner.WithGroup(name), counts: h.counts}
}

// summary says how often each message was logged, where some were not
// written out.
func (h *queueLog) summary() string {
	c := h.counts
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for _, m := range c.order {
		if c.n[m] > queueLogShown {
			parts = append(parts, fmt.Sprintf("%q %d times", m, c.n[m]))
		}
	}
	return strings.Join(parts, ", ")
}
