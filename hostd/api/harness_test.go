package api

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/accounts"
	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/store/storetest"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/hostd/webhook"
)

// productPageRequest is the product page's request.json, verbatim in shape.
const productPageRequest = `{
  "prompt": "This is a sandbox test. Do these steps with the shell and report the real output, never what you expect.",
  "web": false,
  "shell": true,
  "timeout_seconds": 120,
  "max_cost_micros": 40000
}`

// scriptedExecutor is the test seam: each run executes script.
type scriptedExecutor func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error)

func (f scriptedExecutor) Execute(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	return f(ctx, spec, rec)
}

// productPageRun replays the page's run through the Recorder: the timeline
// entries in order and usage that costs $0.00353.
func productPageRun(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	steps := []func() error{
		func() error {
			rec.BootDuration(2420 * time.Millisecond)
			return rec.Event(timeline.MicroVM, timeline.MicroVMReady, nil)
		},
		func() error {
			return rec.Event(timeline.MicroVM, timeline.WorkerStarted(spec.Shell, spec.Web), nil)
		},
		func() error {
			return rec.ContentEvent(timeline.Shell, timeline.Command("pwd; whoami"), map[string]any{"exit_code": 0, "output": "worker"})
		},
		func() error {
			return rec.Charge(ledger.Usage{ModelCalls: 3, InputTokens: 4800, OutputTokens: 414, ModelMicros: 330, ShellCommands: 4})
		},
		func() error { return record(rec, pageRecording(spec)) },
		func() error { return rec.Charge(ledger.Usage{VMTime: 13_333 * time.Millisecond}) },
		func() error {
			if len(spec.Outputs) == 0 {
				return nil
			}
			return rec.Output("report.md", []byte("# Primes\n2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\n"))
		},
		func() error { return rec.Event(timeline.MicroVM, timeline.MicroVMDestroyed, nil) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return runs.Result{}, err
		}
	}
	return runs.Result{Output: "1. Prime script output: 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47"}, nil
}

// record records exchanges as a run's model turns.
func record(rec *runs.Recorder, exchanges []recording.Exchange) error {
	for _, ex := range exchanges {
		rec.Recording().Record(ex)
	}
	return rec.Recording().Err()
}

// pageRecording is the first of the page's model turns as the agent
// records it.
func pageRecording(spec runs.Spec) []recording.Exchange {
	return []recording.Exchange{{
		Turn: 1,
		Request: model.Request{Model: spec.Model, Messages: []model.Message{{Role: model.RoleUser, Text: spec.Prompt}},
			Tools: []model.Tool{{Name: "shell", Description: "Run bash.", InputSchema: json.RawMessage(`{"type":"object"}`)}}},
		Response: &model.Response{StopReason: model.StopToolUse, Usage: model.Usage{InputTokens: 1460, OutputTokens: 40},
			ToolCalls: []model.ToolCall{{ID: "call_1", Name: "shell", Arguments: `{"command":"pwd; whoami"}`}}},
		StartedAt: time.Now().UTC(),
		Duration:  time.Second,
	}}
}

type harness struct {
	t          testing.TB
	url        string
	metricsURL string
	dbPath     string
	store      *store.Store
	svc        *runs.Service
	// accounts signs browsers in: their session cookie works as a key.
	accounts *accounts.Service
	orgID    string
	key      string
}

type harnessConfig struct {
	executor        runs.Executor
	maxActivePerOrg int
	maxConcurrent   int
	credit          int64
	// maxRecordingBytes caps each run's recording (0: the default).
	maxRecordingBytes int64
	limits            Limits
	// credentialRecheck is how often event streams re-check their key.
	credentialRecheck time.Duration
	retention         time.Duration // how long run content is kept; 0: 30 days
	// defaultModel replaces the product page's as the daemon's default;
	// noDefaultModel leaves the daemon without one.
	defaultModel   string
	noDefaultModel bool
	// checkModels refuses models the registry cannot serve (only OpenAI
	// has a key), as the daemon does.
	checkModels bool
	// minimumBudget, when set, is the least budget a run may ask for.
	minimumBudget func(runs.Spec) (int64, error)
}

// newHarness serves the real handlers over HTTP on a fresh SQLite file with
// one organisation, one member key and a credited balance.
func TestMain(m *testing.M) { storetest.Main(m) }

func newHarness(t testing.TB, cfg harnessConfig) *harness {
	t.Helper()
	if cfg.executor == nil {
		cfg.executor = scriptedExecutor(productPageRun)
	}
	if cfg.maxActivePerOrg == 0 {
		cfg.maxActivePerOrg = 100
	}
	if cfg.maxConcurrent == 0 {
		cfg.maxConcurrent = 8
	}
	if cfg.credit == 0 {
		cfg.credit = 10_000_000
	}
	if cfg.retention == 0 {
		cfg.retention = 30 * 24 * time.Hour
	}
	ctx := context.Background()
	st, dbPath := storetest.Open(t)
	hub := timeline.NewHub()
	svc := runs.New(st, hub, runs.Config{Executor: cfg.executor, Rates: ledger.DefaultRates,
		MaxConcurrent: cfg.maxConcurrent, MaxActivePerOrg: cfg.maxActivePerOrg, Retention: cfg.retention,
		MaxRecordingBytes: cfg.maxRecordingBytes})
	accts := accounts.New(st, accounts.Config{KDF: accounts.Params{Time: 1, MemoryKiB: 64, Threads: 1}, StarterCreditMicros: 1_000_000})
	models, err := registry.New(registry.Config{OpenAI: registry.ProviderConfig{APIKey: "sk-test"}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := seal.NewKey(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	defaultModel := cmp.Or(cfg.defaultModel, "openai/gpt-6-luna")
	if cfg.noDefaultModel {
		defaultModel = ""
	}
	var validate func(string) error
	if cfg.checkModels {
		validate = func(name string) error { _, err := models.Lookup(name); return err }
	}
	srv := New(st, svc, Config{DefaultModel: defaultModel, MaxCostMicros: 5_000_000, Limits: cfg.limits,
		ValidateModel: validate, MinimumBudget: cfg.minimumBudget,
		CredentialRecheck: cfg.credentialRecheck, Models: models.Models, Sessions: accts, Webhooks: webhook.NewSecrets(st, key),
		ExampleRequest: func(name string) (json.RawMessage, string, bool) {
			return json.RawMessage(productPageRequest), "openai/gpt-6-luna", name == "product-page"
		}})
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.Config.RegisterOnShutdown(srv.CloseStreams)
	ts.Start()
	metrics := httptest.NewServer(srv.MetricsHandler())
	serveCtx, stopServe := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { defer close(served); svc.Serve(serveCtx, time.Hour) }()
	t.Cleanup(func() {
		srv.CloseStreams()
		ts.Close()
		metrics.Close()
		stopServe()
		<-served
		st.Close()
	})
	h := &harness{t: t, url: ts.URL, metricsURL: metrics.URL, dbPath: dbPath, store: st, svc: svc, accounts: accts}
	h.orgID, h.key = h.newOrg("acme", cfg.credit)
	return h
}

func (h *harness) newOrg(name string, credit int64) (orgID, key string) {
	h.t.Helper()
	ctx := context.Background()
	o, err := h.store.CreateOrg(ctx, name)
	if err != nil {
		h.t.Fatal(err)
	}
	m, err := h.store.AddMember(ctx, o.ID, "dev@"+name+".test")
	if err != nil {
		h.t.Fatal(err)
	}
	k := auth.NewKey()
	if err := h.store.AddKey(ctx, m, k.ID, k.Hash); err != nil {
		h.t.Fatal(err)
	}
	if credit > 0 {
		if _, err := h.store.Credit(ctx, o.ID, credit); err != nil {
			h.t.Fatal(err)
		}
	}
	return o.ID, k.Secret
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r response) apiError(t testing.TB) apiError {
	t.Helper()
	var body struct{ Error apiError }
	r.decode(t, &body)
	return body.Error
}

// do sends a request with the harness key unless headers set another.
func (h *harness) do(method, path, body string, headers ...string) response {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// get fetches url without a key.
func (h *harness) get(url string) response {
	h.t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (h *harness) createRun(body string, headers ...string) runJSON {
	h.t.Helper()
	resp := h.do("POST", "/v1/runs", body, headers...)
	if resp.status != http.StatusCreated {
		h.t.Fatalf("POST /v1/runs: %d %s", resp.status, resp.body)
	}
	var run runJSON
	resp.decode(h.t, &run)
	return run
}

// waitFinished follows the run's event stream to its end and returns the run.
func (h *harness) waitFinished(id string) runJSON {
	h.t.Helper()
	h.sse(id, "")
	var run runJSON
	h.do("GET", "/v1/runs/"+id, "").decode(h.t, &run)
	if !run.Status.Terminal() {
		h.t.Fatalf("run %s still %s after its event stream ended", id, run.Status)
	}
	return run
}

type sseEvent struct {
	id    string
	event string
	data  string
}

// sse reads the run's event stream until the server ends it.
func (h *harness) sse(id, lastEventID string) []sseEvent {
	h.t.Helper()
	headers := []string{"Accept", "text/event-stream"}
	if lastEventID != "" {
		headers = append(headers, "Last-Event-ID", lastEventID)
	}
	resp := h.do("GET", "/v1/runs/"+id+"/events", "", headers...)
	if resp.status != http.StatusOK || !strings.HasPrefix(resp.header.Get("Content-Type"), "text/event-stream") {
		h.t.Fatalf("event stream: %d %s %s", resp.status, resp.header.Get("Content-Type"), resp.body)
	}
	return parseSSE(resp.body)
}

func parseSSE(b []byte) []sseEvent {
	var events []sseEvent
	for _, block := range bytes.Split(b, []byte("\n\n")) {
		var e sseEvent
		for _, line := range strings.Split(string(block), "\n") {
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "id":
				e.id = v
			case "event":
				e.event = v
			case "data":
				e.data = v
			}
		}
		if e.event != "" {
			events = append(events, e)
		}
	}
	return events
}

func (h *harness) balance() ledger.Account {
	h.t.Helper()
	a, err := h.store.Balance(context.Background(), h.orgID)
	if err != nil {
		h.t.Fatal(err)
	}
	if a.Available+a.Held+a.Charged != a.Credited {
		h.t.Fatalf("ledger not conserved: %+v", a)
	}
	return a
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func parseKeyID(t *testing.T, key string) (string, error) {
	t.Helper()
	id, err := auth.ParseID(key)
	if err != nil {
		t.Fatal(err)
	}
	return id, nil
}

// sseReader reads one Server-Sent Event at a time from a live response.
type sseReader struct{ r *bufio.Reader }

func newSSEReader(resp *http.Response) *sseReader { return &sseReader{r: bufio.NewReader(resp.Body)} }

func (s *sseReader) next(t *testing.T) sseEvent {
	t.Helper()
	var block strings.Builder
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("event stream ended: %v (partial %q)", err, block.String())
		}
		if line == "\n" {
			if events := parseSSE([]byte(block.String())); len(events) == 1 {
				return events[0]
			}
			block.Reset() // a keep-alive comment
			continue
		}
		block.WriteString(line)
	}
}
