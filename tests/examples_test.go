package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// update rewrites the example documents in ../examples: go test ./tests
// -run Example -update. The product page's is built from its recording
// and the timeline DESIGN.md quotes; the others are recorded again in real
// microVMs against the fake model provider.
var update = flag.Bool("update", false, "rewrite the example documents in ../examples")

const examplesDir = "../examples"

// The example documents' run and events have the API's shapes.
type exampleRun struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Status            string          `json:"status"`
	Model             string          `json:"model"`
	TimeoutSeconds    int             `json:"timeout_seconds"`
	ZeroDataRetention bool            `json:"zero_data_retention"`
	CreatedAt         time.Time       `json:"created_at"`
	StartedAt         *time.Time      `json:"started_at"`
	FinishedAt        *time.Time      `json:"finished_at"`
	Usage             map[string]any  `json:"usage"`
	Cost              map[string]any  `json:"cost"`
	Output            *string         `json:"output"`
	Error             any             `json:"error"`
	Request           json.RawMessage `json:"request"`
	RetentionExpires  *time.Time      `json:"retention_expires_at"`
	PurgedAt          *time.Time      `json:"purged_at"`
	Outputs           []any           `json:"outputs"`
}

type exampleEvent struct {
	ID       int64          `json:"id"`
	Rev      int64          `json:"rev"`
	T        float64        `json:"t"`
	Category string         `json:"category"`
	Message  string         `json:"message"`
	Data     map[string]any `json:"data"`
}

// writeExample writes e as ../examples/<name>.json, or, without -update,
// fails when the committed document differs from what the generator makes.
func writeExample(t *testing.T, e example.Example) {
	t.Helper()
	e.Format = example.Format
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(e); err != nil {
		t.Fatal(err)
	}
	if _, err := example.Parse(buf.Bytes()); err != nil {
		t.Fatalf("generated example does not parse: %v", err)
	}
	path := filepath.Join(examplesDir, e.Name+".json")
	if *update {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, buf.Bytes()) {
		t.Fatalf("%s is not what its generator makes: go test ./tests -run %s -update", path, t.Name())
	}
}

// rawJSON re-encodes v without HTML escaping (prompts hold "<" and "&").
func rawJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return json.RawMessage(bytes.TrimSpace(buf.Bytes()))
}

// shippedRecording reads the recording of the example named name (a
// document of an older layout held it as the whole file): the document,
// compacted, and its turns.
func shippedRecording(t *testing.T, name string) (json.RawMessage, []recording.Exchange) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(examplesDir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if example.IsExample(data) {
		e, err := example.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		data = e.Recording
	}
	rec, err := recording.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		t.Fatal(err)
	}
	return compact.Bytes(), rec.Exchanges
}

// parseToolResult splits a shell tool result ("exit code: 0\nstdout:\n...
// stderr: (empty)\n") back into its parts.
func parseToolResult(content string) (exit int, stdout, stderr string) {
	rest, _ := strings.CutPrefix(content, "exit code: ")
	code, rest, _ := strings.Cut(rest, "\n")
	json.Unmarshal([]byte(code), &exit)
	out, errPart, _ := strings.Cut(rest, "stderr:")
	stdout = strings.TrimPrefix(strings.TrimPrefix(out, "stdout:\n"), "stdout: (empty)\n")
	stderr = strings.TrimPrefix(strings.TrimPrefix(errPart, "\n"), " (empty)\n")
	return exit, stdout, stderr
}

// The product page's run: its recording as shipped, its timeline as the
// page (and DESIGN.md) show it, with each command's real output from the
// tool results the recording holds.
func TestProductPageExample(t *testing.T) {
	// The recording stays as it was recorded: the real run's.
	recorded, exchanges := shippedRecording(t, "product-page")
	if len(exchanges) != 3 {
		t.Fatalf("the product page's recording has %d turns", len(exchanges))
	}
	results := map[string]string{}
	for _, m := range exchanges[2].Request.Messages {
		for _, r := range m.ToolResults {
			results[r.CallID] = r.Content
		}
	}
	queued := time.Date(2026, 10, 7, 15, 2, 40, 98_000_000, time.UTC)
	at := func(s float64) *time.Time {
		v := queued.Add(time.Duration(math.Round(s*1000)) * time.Millisecond)
		return &v
	}
	commands := []struct {
		call, command string
		t             float64
		durationMS    int64
	}{
		{"call_1", pageWhoami, 5.25, 182},
		{"call_2", pageCurl, 5.25, 413},
		{"call_3", pagePrimes, 10.33, 618},
		{"call_4", pageProof, 10.33, 151},
	}
	events := []exampleEvent{
		{T: 0, Category: timeline.Queued, Message: timeline.Reserved(40000), Data: map[string]any{"reserved_micros": 40000}},
		{T: 2.42, Category: timeline.MicroVM, Message: timeline.MicroVMReady, Data: map[string]any{"boot_ms": 2380}},
		{T: 2.47, Category: timeline.MicroVM, Message: timeline.WorkerStarted(true, false), Data: map[string]any{
			"user": "worker", "shell": true, "web": false, "connections": []string{}, "files": 0}},
	}
	for _, c := range commands {
		exit, stdout, stderr := parseToolResult(results[c.call])
		events = append(events, exampleEvent{T: c.t, Category: timeline.Shell, Message: timeline.Command(c.command), Data: map[string]any{
			"command": c.command, "state": timeline.Done, "exit_code": exit, "timed_out": false, "duration_ms": c.durationMS,
			"stdout": stdout, "stderr": stderr, "output_truncated": false}})
	}
	events = append(events,
		exampleEvent{T: 15.83, Category: timeline.MicroVM, Message: timeline.MicroVMDestroyed, Data: map[string]any{"vm_ms": 13333}},
		exampleEvent{T: 15.84, Category: timeline.Successful, Message: timeline.ModelSummary(3, 5214), Data: map[string]any{
			"status": "succeeded", "model_calls": 3, "tokens": 5214}},
		exampleEvent{T: 16.24, Category: timeline.WorkerDestroyed, Message: timeline.Settled(3530, 36470), Data: map[string]any{
			"charged_micros": 3530, "released_micros": 36470, "model_micros": 330, "web_micros": 0, "compute_micros": 3200}},
	)
	for i := range events {
		events[i].ID, events[i].Rev = int64(i+1), int64(i+1)
	}
	answer := exchanges[2].Response.Text
	var request map[string]any
	if err := json.Unmarshal([]byte(productPageRequest), &request); err != nil {
		t.Fatal(err)
	}
	run := exampleRun{
		ID: "run_de9af30ebaaa50ab76819bb536239c61", Object: "run", Status: "succeeded", Model: "openai/gpt-6-luna",
		TimeoutSeconds: 120, CreatedAt: queued, StartedAt: at(0.01), FinishedAt: at(16.24),
		Usage: map[string]any{"model_calls": 3, "input_tokens": 5016, "output_tokens": 198, "tokens": 5214,
			"shell_commands": 4, "web_requests": 0, "vm_seconds": 13.333},
		Cost: map[string]any{"reserved_micros": 40000, "charged_micros": 3530, "released_micros": 36470,
			"model_micros": 330, "web_micros": 0, "compute_micros": 3200},
		Output: &answer,
		Request: rawJSON(t, map[string]any{"prompt": request["prompt"], "model": "openai/gpt-6-luna", "shell": true, "web": false,
			"connections": []any{}, "files": []any{}, "timeout_seconds": 120, "max_cost_micros": 40000, "zero_data_retention": false}),
		RetentionExpires: at(16.24 + 30*24*3600),
		Outputs:          []any{},
	}
	writeExample(t, example.Example{
		Name: "product-page", Order: 1,
		Title: example.Text{
			"en": "Run untrusted code safely: an AI agent in a disposable sandbox",
			"de": "Nicht vertrauenswürdigen Code sicher ausführen: ein KI-Agent in einer Wegwerf-Sandbox",
		},
		Summary: example.Text{
			"en": "The agent writes and runs a script, tries to reach the internet and reports that the call fails in a microVM that disappears afterwards.",
			"de": "Der Agent schreibt und führt ein Skript aus, versucht das Internet zu erreichen und meldet, dass der Aufruf in einer microVM fehlschlägt, die danach verschwindet.",
		},
		HowItWorks: example.Text{
			"en": "Web access is off and the shell is on, so the agent can run code but cannot send anything out. The prompt asks it to try a network call and report the exact error, which makes the isolation visible on the timeline. Nothing it writes survives the run.",
			"de": "Der Webzugriff ist aus und die Shell ist an, sodass der Agent Code ausführen, aber nichts nach außen senden kann. Der Prompt bittet ihn, einen Netzwerkaufruf zu versuchen und den genauen Fehler zu melden, was die Isolation im Zeitverlauf sichtbar macht. Nichts, was er schreibt, überlebt die Ausführung.",
		},
		Request:   json.RawMessage(productPageRequest),
		Run:       rawJSON(t, run),
		Events:    rawJSON(t, events),
		Recording: recorded,
	})
}

// scriptedModel answers the first call with first and the second with the
// text answer writes from the tool results the model really got, as a
// model would.
func scriptedModel(first fakeprovider.Turn, answer func(results map[string]string) string, usage fakeprovider.Usage) http.Handler {
	fake := fakeprovider.New(first)
	var mu sync.Mutex
	calls := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 32<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		calls++
		if calls == 2 {
			fake.Append(fakeprovider.Turn{Text: answer(toolOutputs(body)), Usage: usage})
		}
		mu.Unlock()
		fake.ServeHTTP(w, r)
	})
}

// recordThroughAPI runs request on a daemon the composition root builds,
// in-process (so that opts can reach a test upstream), through its HTTP
// API with a member key of an organisation set up as registration does;
// the model answers from model. It returns the run, its timeline and its
// recording as the API serves them.
func recordThroughAPI(t *testing.T, request string, opts system.Options, model http.Handler) (run, events, rec json.RawMessage) {
	t.Helper()
	requireVM(t)
	ctx := context.Background()
	modelSrv := httptest.NewServer(model)
	defer modelSrv.Close()
	cfg := config.Defaults()
	cfg.StateDir, cfg.OpenAIBaseURL, cfg.MaxConcurrentRuns = stateDir(), modelSrv.URL+"/v1", 1
	cfg.DefaultModel = "openai/gpt-6-luna"
	dir := t.TempDir()
	opts.Database, opts.SandboxDir, opts.Logger = filepath.Join(dir, "ephemeral.db"), filepath.Join(dir, "sandboxes"), slog.New(slog.NewTextHandler(t.Output(), nil))
	sys, err := system.New(ctx, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sys.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		assertNothingLeft(t, opts.SandboxDir)
	}()
	if err := sys.Start(ctx); err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(sys.Handler())
	defer api.Close()
	org, err := sys.Store.CreateOrg(ctx, "examples")
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.ProvisionOrg(ctx, org.ID); err != nil {
		t.Fatal(err)
	}
	m, err := sys.Store.AddMember(ctx, org.ID, "examples@ephemeral.test")
	if err != nil {
		t.Fatal(err)
	}
	key := auth.NewKey()
	if err := sys.Store.AddKey(ctx, m, key.ID, key.Hash); err != nil {
		t.Fatal(err)
	}
	if _, err := sys.Store.Credit(ctx, org.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	d := daemon{url: api.URL, key: key.Secret}
	var created apiRun
	if status := d.call(t, "POST", "/v1/runs", strings.NewReader(request), map[string]string{"Content-Type": "application/json"}, &created); status != http.StatusCreated {
		t.Fatalf("POST /v1/runs: %d %+v", status, created.Error)
	}
	if finished, _ := d.waitRun(t, created.ID); finished.Status != "succeeded" {
		t.Fatalf("run %s: %+v", finished.Status, finished.Error)
	}
	var page struct {
		Data json.RawMessage `json:"data"`
	}
	d.call(t, "GET", "/v1/runs/"+created.ID, nil, nil, &run)
	d.call(t, "GET", "/v1/runs/"+created.ID+"/events", nil, nil, &page)
	d.call(t, "GET", "/v1/runs/"+created.ID+"/recording", nil, nil, &rec)
	var compact bytes.Buffer
	json.Compact(&compact, rec)
	return run, page.Data, compact.Bytes()
}

// checkCommitted checks, without -update, that the committed document of
// an example recorded in a microVM parses and holds timeline entries with
// each of want.
func checkCommitted(t *testing.T, name string, want ...string) example.Example {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(examplesDir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := example.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	var events []exampleEvent
	if err := json.Unmarshal(e.Events, &events); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, ev := range events {
		lines = append(lines, ev.Category+": "+ev.Message)
	}
	all := strings.Join(lines, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("%s's timeline lacks %q:\n%s", name, w, all)
		}
	}
	return e
}

const crmRequest = `{
  "prompt": "Which of our customers are in Germany? Look them up in the example-crm connection and show them as a Markdown table with their plan and monthly revenue. Then check that the connection refuses to create a customer.",
  "shell": true,
  "web": false,
  "connections": [{"name": "example-crm", "methods": ["GET"]}],
  "timeout_seconds": 120,
  "max_cost_micros": 40000
}`

// The example that uses the read-only example CRM: recorded in a real
// microVM, against the fake model provider.
func TestCRMExample(t *testing.T) {
	if !*update {
		checkCommitted(t, "crm-lookup", "Connection: GET example-crm /customers → 200", "POST example-crm /customers → 403 refused")
		return
	}
	lookup := `curl -sS -m 30 "$EPHEMERAL_CONNECTIONS_URL/example-crm/customers?country=DE" | python3 -m json.tool`
	create := `curl -sS -m 30 -o /dev/null -w '%{http_code}\n' -X POST -H 'Content-Type: application/json' ` +
		`-d '{"name":"Test GmbH"}' "$EPHEMERAL_CONNECTIONS_URL/example-crm/customers"`
	model := scriptedModel(fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
		toolCall("call_1", agent.ConnectionTool, map[string]string{"connection": examplecrm.Name, "path": "/customers?country=DE"}),
		shellCall("call_2", lookup),
		shellCall("call_3", create),
	}, Usage: fakeprovider.Usage{InputTokens: 1540, OutputTokens: 96}},
		func(results map[string]string) string {
			for _, name := range []string{"Ada Analytics GmbH", "Elbe Health e.V."} {
				if !strings.Contains(results["call_1"], name) || !strings.Contains(results["call_2"], name) {
					t.Fatalf("the CRM did not return %s: %q", name, results)
				}
			}
			status := regexp.MustCompile(`(?m)^[0-9]{3}$`).FindString(results["call_3"])
			return "| Customer | Plan | Monthly revenue |\n|---|---|---|\n| Ada Analytics GmbH | enterprise | $4,200 |\n| Elbe Health e.V. | enterprise | $3,100 |\n\n" +
				"Creating a customer was refused with HTTP " + status + ": this run may only read from example-crm."
		}, fakeprovider.Usage{InputTokens: 2210, OutputTokens: 84})
	run, events, rec := recordThroughAPI(t, crmRequest, system.Options{}, model)
	writeExample(t, example.Example{
		Name: "crm-lookup", Order: 2,
		Title: example.Text{
			"en": "Query a CRM without handing over its credentials",
			"de": "Ein CRM abfragen, ohne seine Zugangsdaten herauszugeben",
		},
		Summary: example.Text{
			"en": "The agent looks up customers in the read-only example CRM from its tool and with curl inside the microVM, and finds that writing is refused.",
			"de": "Der Agent sucht Kunden im schreibgeschützten Beispiel-CRM, mit seinem Werkzeug und mit curl in der microVM, und stellt fest, dass Schreiben abgelehnt wird.",
		},
		HowItWorks: example.Text{
			"en": "The run is granted one connection, example-crm, with GET only. Inside the microVM the connection is a URL of the broker; the broker adds the CRM's token to every call, so neither the model nor the code ever sees it, and refuses any method the run was not granted. Every call is on the timeline.",
			"de": "Die Ausführung erhält eine Verbindung, example-crm, nur mit GET. In der microVM ist die Verbindung eine URL des Brokers; der Broker ergänzt bei jedem Aufruf das Token des CRM, sodass weder das Modell noch der Code es je sieht, und lehnt jede nicht gewährte Methode ab. Jeder Aufruf steht im Zeitverlauf.",
		},
		Request: json.RawMessage(crmRequest), Run: run, Events: events, Recording: rec,
	})
}

const webRequest = `{
  "prompt": "Fetch http://example.com/ twice: once with your web_fetch tool and once with curl inside the VM. Report the page's title, the HTTP status and size each got, in two Markdown bullet points.",
  "shell": true,
  "web": true,
  "timeout_seconds": 120,
  "max_cost_micros": 40000
}`

// examplePage stands in for http://example.com/ while the web example is
// recorded: the machines it is recorded on have no internet.
const examplePage = `<!doctype html>
<html>
<head>
    <title>Example Domain</title>
    <meta charset="utf-8" />
</head>
<body>
<div>
    <h1>Example Domain</h1>
    <p>This domain is for use in illustrative examples in documents. You may use this
    domain in literature without prior coordination or asking for permission.</p>
</div>
</body>
</html>
`

// The example with web on: recorded in a real microVM behind the real
// broker, against the fake model provider, with a stand-in for
// example.com in a network namespace of the test's own.
func TestWebExample(t *testing.T) {
	if !*update {
		checkCommitted(t, "web-fetch", "Web: GET example.com → 200")
		return
	}
	requireVM(t)
	up := newUpstreamHostOn(t, examplePage, 80)
	opts := system.Options{
		BrokerResolver:        testResolver{"example.com": up.addr},
		UnsafeBrokerTestHooks: &broker.TestHooks{AllowAddress: func(a netip.Addr) bool { return a == up.addr }},
	}
	fetch := `curl -sS -m 30 -o page.html -w '%{http_code} %{size_download}\n' http://example.com/ && grep -o '<title>[^<]*</title>' page.html`
	model := scriptedModel(fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
		toolCall("call_1", agent.WebFetchTool, map[string]string{"url": "http://example.com/"}),
		shellCall("call_2", fetch),
	}, Usage: fakeprovider.Usage{InputTokens: 1380, OutputTokens: 72}},
		func(results map[string]string) string {
			if !strings.Contains(results["call_1"], "status: 200") || !strings.Contains(results["call_2"], "<title>Example Domain</title>") {
				t.Fatalf("the fetches failed: %q", results)
			}
			curl := regexp.MustCompile(`(?m)^200 ([0-9]+)$`).FindStringSubmatch(results["call_2"])
			if curl == nil {
				t.Fatalf("curl's status line: %q", results["call_2"])
			}
			return fmt.Sprintf("- **web_fetch**: HTTP 200, %d bytes, title \"Example Domain\"\n"+
				"- **curl in the VM**: HTTP 200, %s bytes, title \"Example Domain\"\n\n"+
				"Both requests went through the broker, which is the VM's only way out.", len(examplePage), curl[1])
		}, fakeprovider.Usage{InputTokens: 2050, OutputTokens: 61})
	run, events, rec := recordThroughAPI(t, webRequest, opts, model)
	writeExample(t, example.Example{
		Name: "web-fetch", Order: 3,
		Title: example.Text{
			"en": "Let the agent browse, through a broker",
			"de": "Den Agenten surfen lassen, über einen Broker",
		},
		Summary: example.Text{
			"en": "With web on, the agent fetches a page with its tool and with curl in the microVM; both requests leave only through the broker, which meters them.",
			"de": "Mit eingeschaltetem Web lädt der Agent eine Seite mit seinem Werkzeug und mit curl in der microVM; beide Anfragen verlassen die Maschine nur über den Broker, der sie misst.",
		},
		HowItWorks: example.Text{
			"en": "Web on gives the VM one way out: the broker, as its HTTP proxy. The broker resolves each name once, refuses private, loopback and metadata addresses, and puts every request on the timeline, where it is charged at the web price. Recorded against a stand-in for example.com, as the machine that recorded it has no internet; a replay fetches the real page.",
			"de": "Mit Web an hat die VM einen Weg nach draußen: den Broker als HTTP-Proxy. Der Broker löst jeden Namen einmal auf, lehnt private, Loopback- und Metadaten-Adressen ab und trägt jede Anfrage in den Zeitverlauf ein, wo sie zum Web-Preis berechnet wird. Aufgezeichnet gegen einen Ersatz für example.com, da die aufzeichnende Maschine kein Internet hat; eine Wiedergabe lädt die echte Seite.",
		},
		Request: json.RawMessage(webRequest), Run: run, Events: events, Recording: rec,
	})
}
