package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store/storebench"
	"github.com/ephemeralhq/ephemeral/hostd/system"
)

var benchStoreCommand = &cli.Command{
	Name:  "store",
	Usage: "measure API latencies on databases of growing history and print each one's ratio, largest to smallest",
	Description: "For each size, fills a fresh database with that many finished runs of one organisation " +
		"(12 timeline entries and a 20 KB recording each, the oldest 10% past their retention) and serves the " +
		"API on it on loopback, with runs that finish at once (no VMs). Then it times each endpoint one request " +
		"at a time, to each size in turn (medians), the longest wait of a POST /v1/runs while the janitor purges " +
		"the expired 10%, next to the longest of as many POSTs without it, and the janitor's sweep with " +
		"nothing left to purge.",
	Flags: []cli.Flag{
		&cli.IntSliceFlag{Name: "runs", Value: cli.NewIntSlice(1_000, 10_000, 100_000), Usage: "history sizes, in finished runs"},
		&cli.IntFlag{Name: "requests", Value: 200, Usage: "requests per endpoint and size"},
		&cli.StringFlag{Name: "dir", Usage: "directory for the databases (default: the system's temporary directory); they are removed at the end"},
	},
	Action: func(c *cli.Context) error {
		b := storeBench{sizes: c.IntSlice("runs"), requests: c.Int("requests"), dir: c.String("dir"), out: os.Stdout, log: os.Stderr}
		return b.run(c.Context)
	},
}

// storeBench measures how the daemon's latencies change with the number
// of finished runs in its database.
type storeBench struct {
	sizes    []int
	requests int
	dir      string
	out      io.Writer // the table
	log      io.Writer // progress and details
}

// What is measured for each size, in the order the table prints.
var storeBenchRows = []string{
	"POST /v1/runs (the busy org)",
	"GET /v1/runs",
	"GET /v1/runs?starting_after= (oldest page)",
	"GET /v1/runs?status=succeeded (every run)",
	"GET /v1/runs?status=failed (no run)",
	"GET /v1/runs/{id}",
	"GET /v1/runs/{id}/events",
	"GET /v1/balance",
	"GET /healthz",
	"GET /metrics",
	"janitor sweep, nothing to purge",
	"longest POST wait, janitor purging 10%",
	"longest POST wait, as many POSTs, no janitor",
}

func (b storeBench) run(ctx context.Context) (err error) {
	if len(b.sizes) < 2 || b.requests < 1 {
		return cli.Exit("ephemeral bench store: give at least two sizes (--runs) and one request", 2)
	}
	for _, n := range b.sizes {
		if n < 100 {
			return cli.Exit(fmt.Sprintf("ephemeral bench store: %d runs: at least 100", n), 2)
		}
	}
	daemons := make([]*benchDaemon, 0, len(b.sizes))
	defer func() {
		for _, d := range daemons {
			err = errors.Join(err, d.close())
		}
	}()
	for _, n := range b.sizes {
		d, err := startBenchDaemon(ctx, b.dir, n, b.log)
		if err != nil {
			return fmt.Errorf("%d runs: %w", n, err)
		}
		daemons = append(daemons, d)
	}
	results := make([]map[string]time.Duration, len(daemons))
	for i := range results {
		results[i] = map[string]time.Duration{}
	}
	for _, row := range storeBenchRows {
		if request, ok := benchRequests[row]; ok {
			if err := interleave(ctx, daemons, b.requests, row, request, results); err != nil {
				return err
			}
		}
	}
	for i, d := range daemons {
		if err := d.measurePurge(ctx, results[i], b.log); err != nil {
			return fmt.Errorf("%s runs: %w", count(d.n), err)
		}
	}
	// Now that each has purged its expired runs:
	const sweep = "janitor sweep, nothing to purge"
	if err := interleave(ctx, daemons, max(b.requests/10, 3), sweep, sweepNothing, results); err != nil {
		return err
	}

	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprint(w, "latency (median unless longest)\t")
	for _, n := range b.sizes {
		fmt.Fprintf(w, "%10s\t", count(n)+" runs")
	}
	fmt.Fprintf(w, "%8s\n", count(b.sizes[len(b.sizes)-1])+"/"+count(b.sizes[0]))
	for _, row := range storeBenchRows {
		fmt.Fprintf(w, "%s\t", row)
		for _, r := range results {
			fmt.Fprintf(w, "%7.2f ms\t", float64(r[row])/float64(time.Millisecond))
		}
		fmt.Fprintf(w, "%8.2f\n", float64(results[len(results)-1][row])/float64(results[0][row]))
	}
	return w.Flush()
}

// interleave times n requests to each daemon, one to each in turn, so that
// whatever else the machine does meanwhile weighs on every size alike, and
// stores each daemon's median as its row in results.
func interleave(ctx context.Context, daemons []*benchDaemon, n int, row string,
	request func(context.Context, *benchDaemon) (time.Duration, error), results []map[string]time.Duration) error {
	samples := make([][]time.Duration, len(daemons))
	for range n {
		for i, d := range daemons {
			took, err := request(ctx, d)
			if err != nil {
				return fmt.Errorf("%s runs: %s: %w", count(d.n), row, err)
			}
			samples[i] = append(samples[i], took)
		}
	}
	for i := range daemons {
		results[i][row] = percentile(samples[i], 50)
	}
	return nil
}

// sweepNothing times one janitor sweep that finds nothing to purge.
func sweepNothing(ctx context.Context, d *benchDaemon) (time.Duration, error) {
	began := time.Now()
	purged, err := d.sys.Runs.Sweep(ctx)
	if err == nil && purged != 0 {
		err = fmt.Errorf("purged %d runs, want none", purged)
	}
	return time.Since(began), err
}

// benchRequests time one request of their row of the table.
var benchRequests = map[string]func(context.Context, *benchDaemon) (time.Duration, error){
	"POST /v1/runs (the busy org)": func(ctx context.Context, d *benchDaemon) (time.Duration, error) { return d.client.createRun(ctx) },
	"GET /v1/runs":                 getting(func(*benchDaemon) string { return "/v1/runs" }),
	// The 20 oldest runs: the deepest page there is.
	"GET /v1/runs?starting_after= (oldest page)": getting(func(d *benchDaemon) string { return "/v1/runs?starting_after=" + d.runIDs[20] }),
	// Every run succeeded: a filter that matches all of them, and one
	// that matches none, which must not read them all to say so.
	"GET /v1/runs?status=succeeded (every run)": getting(func(*benchDaemon) string { return "/v1/runs?status=succeeded" }),
	"GET /v1/runs?status=failed (no run)":       getting(func(*benchDaemon) string { return "/v1/runs?status=failed" }),
	"GET /v1/runs/{id}":                         getting(func(d *benchDaemon) string { return "/v1/runs/" + d.someRun() }),
	"GET /v1/runs/{id}/events":                  getting(func(d *benchDaemon) string { return "/v1/runs/" + d.someRun() + "/events" }),
	"GET /v1/balance":                           getting(func(*benchDaemon) string { return "/v1/balance" }),
	"GET /healthz":                              getting(func(*benchDaemon) string { return "/healthz" }),
	"GET /metrics":                              getting(func(*benchDaemon) string { return "/metrics" }),
}

func getting(path func(*benchDaemon) string) func(context.Context, *benchDaemon) (time.Duration, error) {
	return func(ctx context.Context, d *benchDaemon) (time.Duration, error) { return d.client.get(ctx, path(d)) }
}

// count writes 100000 as 100k.
func count(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// finishAtOnce is the benchmark's executor: runs succeed without a VM, so
// what is measured is the API and the database.
type finishAtOnce struct{}

func (finishAtOnce) Execute(context.Context, runs.Spec, *runs.Recorder) (runs.Result, error) {
	return runs.Result{Output: "done"}, nil
}

// benchDaemon is the daemon serving one size of history on loopback.
type benchDaemon struct {
	n      int
	dir    string
	dbPath string
	sys    *system.System
	srv    *http.Server
	served chan error
	client *benchClient
	runIDs []string // oldest first
	rnd    *rand.Rand
}

// startBenchDaemon fills a fresh database with n finished runs and serves
// the API on it.
func startBenchDaemon(ctx context.Context, parent string, n int, log io.Writer) (_ *benchDaemon, err error) {
	d := &benchDaemon{n: n, rnd: rand.New(rand.NewPCG(1, uint64(n)))}
	if d.dir, err = os.MkdirTemp(parent, "ephemeral-bench-store-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.close())
		}
	}()
	d.dbPath = filepath.Join(d.dir, "ephemeral.db")
	cfg := config.Defaults()
	cfg.StateDir = d.dir
	// The default model must be usable for runs to be accepted; the
	// executor never calls it.
	cfg.OpenAIBaseURL, cfg.DefaultModel = "http://127.0.0.1:9/v1", "openai/gpt-6-luna"
	// The bench is one client sending as fast as it can: the API's abuse
	// limits would answer it 429.
	cfg.LimitKeyRunCreations, cfg.LimitKeyReads, cfg.LimitKeyStreams = 1_000_000, 1_000_000, 1_000_000
	cfg.LimitAddressRunCreations, cfg.LimitAddressReads, cfg.LimitAddressStreams = 1_000_000, 1_000_000, 1_000_000

	began := time.Now()
	history, err := storebench.Populate(ctx, d.dbPath, storebench.History{Runs: n, Expired: n / 10, EventsPerRun: 12,
		RecordingBytes: 20_000, Retention: cfg.Retention, Now: time.Now()})
	if err != nil {
		return nil, err
	}
	d.runIDs = history.RunIDs
	fmt.Fprintf(log, "%s runs: populated in %.1f s, %s\n", count(n), time.Since(began).Seconds(), fileSizes(d.dbPath))

	d.sys, err = system.New(ctx, cfg, system.Options{
		Database:  d.dbPath,
		Executor:  finishAtOnce{},
		Reconcile: func(context.Context, []string) error { return nil },
		Logger:    slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// /metrics is served on its own listener in the daemon; one listener
	// serving both does here.
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.sys.API.MetricsHandler())
	mux.Handle("/", d.sys.API.Handler())
	d.srv = &http.Server{Handler: mux}
	d.served = make(chan error, 1)
	go func() { d.served <- d.srv.Serve(ln) }()
	d.client = &benchClient{base: "http://" + ln.Addr().String(), key: history.APIKey}
	return d, nil
}

func (d *benchDaemon) someRun() string { return d.runIDs[d.rnd.IntN(len(d.runIDs))] }

// close stops serving, closes the daemon and removes its database.
func (d *benchDaemon) close() error {
	var errs []error
	if d.srv != nil {
		d.srv.Close()
		if err := <-d.served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if d.sys != nil {
		errs = append(errs, d.sys.Close())
	}
	return errors.Join(append(errs, os.RemoveAll(d.dir))...)
}

// measurePurge times POSTs while the janitor purges the expired tenth of
// the runs (each POST waits, untimed, for its run to finish before the
// next), and as many POSTs again without it.
func (d *benchDaemon) measurePurge(ctx context.Context, m map[string]time.Duration, log io.Writer) error {
	swept := make(chan error, 1)
	sweepBegan := time.Now()
	go func() {
		purged, err := d.sys.Runs.Sweep(ctx)
		if err == nil && purged != d.n/10 {
			err = fmt.Errorf("the janitor purged %d runs, want %d", purged, d.n/10)
		}
		swept <- err
	}()
	var waits []time.Duration
	for sweeping := true; sweeping; {
		took, err := d.client.createRun(ctx)
		if err != nil {
			<-swept
			return fmt.Errorf("POST /v1/runs while the janitor purges: %w", err)
		}
		waits = append(waits, took)
		select {
		case err := <-swept:
			if err != nil {
				return err
			}
			sweeping = false
		default:
		}
	}
	m["longest POST wait, janitor purging 10%"] = percentile(waits, 100)
	fmt.Fprintf(log, "%s runs: the janitor purged %d runs in %.2f s; %d POSTs meanwhile: p50 %s, p99 %s, longest %s; %s\n",
		count(d.n), d.n/10, time.Since(sweepBegan).Seconds(), len(waits), storeMillis(percentile(waits, 50)),
		storeMillis(percentile(waits, 99)), storeMillis(percentile(waits, 100)), fileSizes(d.dbPath))

	// The longest wait this machine gives as many requests anyway
	// (scheduling, disk), to tell the janitor's share.
	var calm []time.Duration
	for range waits {
		took, err := d.client.createRun(ctx)
		if err != nil {
			return fmt.Errorf("POST /v1/runs: %w", err)
		}
		calm = append(calm, took)
	}
	m["longest POST wait, as many POSTs, no janitor"] = percentile(calm, 100)
	fmt.Fprintf(log, "%s runs: %d POSTs without the janitor: p50 %s, p99 %s, longest %s\n", count(d.n), len(calm),
		storeMillis(percentile(calm, 50)), storeMillis(percentile(calm, 99)), storeMillis(percentile(calm, 100)))
	return nil
}

func storeMillis(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// percentile is the nearest-rank percentile of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := (p*len(s) + 99) / 100 // ceil(p/100 * n)
	return s[max(rank, 1)-1]
}

// fileSizes describes the database file and its WAL.
func fileSizes(dbPath string) string {
	var parts []string
	for _, suffix := range []string{"", "-wal"} {
		if fi, err := os.Stat(dbPath + suffix); err == nil {
			parts = append(parts, fmt.Sprintf("%s%s %.1f MB", filepath.Base(dbPath), suffix, float64(fi.Size())/1e6))
		}
	}
	return strings.Join(parts, ", ")
}

// benchClient calls the API as the busy organisation, one request at a time.
type benchClient struct {
	base, key string
	http      http.Client
	created   int
}

// get times one GET and checks that it succeeded.
func (c *benchClient) get(ctx context.Context, path string) (time.Duration, error) {
	began := time.Now()
	if _, err := c.do(ctx, "GET", path, "", http.StatusOK); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}

// createRun times one POST /v1/runs, then waits (untimed) until the run
// has finished, so that its writes do not overlap the next request.
func (c *benchClient) createRun(ctx context.Context) (time.Duration, error) {
	c.created++
	body := `{"prompt":"benchmark run","shell":true,"timeout_seconds":120,"max_cost_micros":40000}`
	began := time.Now()
	created, err := c.do(ctx, "POST", "/v1/runs", body, http.StatusCreated, "Idempotency-Key", fmt.Sprint("bench-new-", c.created))
	if err != nil {
		return 0, err
	}
	took := time.Since(began)
	var run struct{ ID string }
	if err := json.Unmarshal(created, &run); err != nil || run.ID == "" {
		return 0, fmt.Errorf("POST /v1/runs answered %s", created)
	}
	// The event stream ends when the run has.
	if _, err := c.do(ctx, "GET", "/v1/runs/"+run.ID+"/events", "", http.StatusOK, "Accept", "text/event-stream"); err != nil {
		return 0, err
	}
	return took, nil
}

func (c *benchClient) do(ctx context.Context, method, path, body string, want int, headers ...string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		return nil, errors.New(method + " " + path + ": " + resp.Status + ": " + string(b))
	}
	return b, nil
}
