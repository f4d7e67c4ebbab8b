package tests

import (
	"bytes"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
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

// shippedRecording reads the recording of the example named name, which a
// document of an older layout held as the whole file.
func shippedRecording(t *testing.T, name string) []recording.Exchange {
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
	exchanges, err := recording.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return exchanges
}

func encodeRecording(t *testing.T, exchanges []recording.Exchange) json.RawMessage {
	t.Helper()
	var buf bytes.Buffer
	if err := recording.Encode(&buf, exchanges); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	return compact.Bytes()
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
	exchanges := shippedRecording(t, "product-page")
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
		Recording: encodeRecording(t, exchanges),
	})
}
