package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// outputsExecutor keeps the files a run of the product page could have
// written, among them a page with a script.
func outputsExecutor(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	for _, f := range []struct{ path, data string }{
		{"report.md", "# Primes\n2 3 5 7\n"},
		{"out/a b.csv", "n,prime\n1,2\n"},
		{"out/page.html", "<script>alert(document.cookie)</script>"},
	} {
		if err := rec.Output(f.path, []byte(f.data)); err != nil {
			return runs.Result{}, err
		}
	}
	return runs.Result{Output: "done"}, nil
}

func TestOutputsAreListedAndDownloaded(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(outputsExecutor)})
	run := h.waitFinished(h.createRun(`{"prompt":"p","max_cost_micros":1000,"outputs":["report.md","out/*"]}`).ID)
	if len(run.Outputs) != 3 {
		t.Fatalf("outputs %+v", run.Outputs)
	}
	sum := sha256.Sum256([]byte("n,prime\n1,2\n"))
	csv := run.Outputs[0]
	if csv.Path != "out/a b.csv" || csv.Size != 12 || csv.SHA256 != hex.EncodeToString(sum[:]) ||
		csv.ContentType != "text/csv; charset=utf-8" || csv.DownloadURL != "/v1/runs/"+run.ID+"/outputs/out/a%20b.csv" {
		t.Errorf("listed %+v", csv)
	}
	// The list shows them too.
	var list struct{ Data []runJSON }
	h.do("GET", "/v1/runs", "").decode(t, &list)
	if len(list.Data) != 1 || len(list.Data[0].Outputs) != 3 {
		t.Errorf("listed runs %+v", list.Data)
	}

	resp := h.do("GET", csv.DownloadURL, "")
	if resp.status != http.StatusOK || string(resp.body) != "n,prime\n1,2\n" || resp.header.Get("Content-Type") != "text/csv; charset=utf-8" ||
		resp.header.Get("Content-Disposition") != `attachment; filename="a b.csv"` || resp.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("download: %d %q %v", resp.status, resp.body, resp.header)
	}
	// A hostile page is an attachment in a sandbox, never a page of the API's origin.
	page := h.do("GET", "/v1/runs/"+run.ID+"/outputs/out/page.html", "")
	if page.status != http.StatusOK || page.header.Get("Content-Type") != "text/html; charset=utf-8" ||
		!strings.HasPrefix(page.header.Get("Content-Disposition"), "attachment") || page.header.Get("X-Content-Type-Options") != "nosniff" ||
		!strings.Contains(page.header.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("page download headers %v", page.header)
	}
	for _, p := range []string{"out/missing.csv", "out", "out/", "%2e%2e/x", "out%2F..%2F..%2Fx", "report.md%00"} {
		if r := h.do("GET", "/v1/runs/"+run.ID+"/outputs/"+p, ""); r.status != http.StatusNotFound {
			t.Errorf("GET outputs/%s: %d", p, r.status)
		}
	}
	// Another organisation's key cannot download it.
	_, otherKey := h.newOrg("globex", 0)
	if r := h.do("GET", csv.DownloadURL, "", "Authorization", "Bearer "+otherKey); r.status != http.StatusNotFound {
		t.Errorf("another organisation's download: %d", r.status)
	}

	// Purging the run removes its outputs.
	var purged runJSON
	h.do("DELETE", "/v1/runs/"+run.ID, "").decode(t, &purged)
	if len(purged.Outputs) != 0 {
		t.Errorf("outputs after purge %+v", purged.Outputs)
	}
	if r := h.do("GET", csv.DownloadURL, ""); r.status != http.StatusNotFound || r.apiError(t).Code != "output_not_found" {
		t.Errorf("download after purge: %d %s", r.status, r.body)
	}
}

// Under zero data retention the outputs are never stored: each is listed
// until it has been downloaded once.
func TestZeroRetentionOutputsAreReturnedOnce(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(outputsExecutor)})
	run := h.waitFinished(h.createRun(`{"prompt":"p","max_cost_micros":1000,"outputs":["report.md"],"zero_data_retention":true}`).ID)
	if len(run.Outputs) != 3 || run.Outputs[0].Path != "report.md" {
		t.Fatalf("outputs %+v", run.Outputs)
	}
	if listed, _ := h.store.OutputsOf(context.Background(), []string{run.ID}); len(listed[run.ID]) != 0 {
		t.Errorf("zero-retention outputs stored: %+v", listed)
	}
	first := h.do("GET", run.Outputs[0].DownloadURL, "")
	if first.status != http.StatusOK || string(first.body) != "# Primes\n2 3 5 7\n" {
		t.Fatalf("first download: %d %q", first.status, first.body)
	}
	if again := h.do("GET", run.Outputs[0].DownloadURL, ""); again.status != http.StatusNotFound {
		t.Errorf("second download: %d", again.status)
	}
	var now runJSON
	h.do("GET", "/v1/runs/"+run.ID, "").decode(t, &now)
	if len(now.Outputs) != 2 {
		t.Errorf("listed after one download: %+v", now.Outputs)
	}
}

// The canonical request (what idempotency compares and what is stored)
// writes a file's content and mode one way however they were given, and
// leaves the new fields out when they are not used.
func TestCanonicalRequestOfFilesOutputsAndWebhook(t *testing.T) {
	lim := limits{defaultModel: "m", maxCostMicros: 1000}
	canon := func(body string) string {
		t.Helper()
		var req runRequest
		if apiErr := decodeBody([]byte(body), &req); apiErr != nil {
			t.Fatal(apiErr)
		}
		c, apiErr := req.validate(lim)
		if apiErr != nil {
			t.Fatalf("%s: %+v", body, apiErr)
		}
		return string(c.encode())
	}
	plain := canon(`{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x"}]}`)
	if want := `{"prompt":"p","model":"m","shell":false,"web":false,"connections":[],"files":[{"path":"a","content":"x"}],` +
		`"timeout_seconds":120,"max_cost_micros":1,"zero_data_retention":false}`; plain != want {
		t.Errorf("a request without the new fields encodes as\n%s\nnot as before:\n%s", plain, want)
	}
	for _, same := range []string{
		`{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","encoding":"utf-8","mode":"644"}]}`,
		`{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","mode":"0644"}]}`,
	} {
		if got := canon(same); got != plain {
			t.Errorf("%s encodes as %s", same, got)
		}
	}
	bin := canon(`{"prompt":"p","max_cost_micros":1,"files":[{"path":"run.sh","content":"IyEvYmluL3NoCg==\n","encoding":"base64","mode":"755"}],` +
		`"outputs":["out/*.csv"],"webhook_url":"https://hooks.acme.example/e"}`)
	if !strings.Contains(bin, `"files":[{"path":"run.sh","content":"IyEvYmluL3NoCg==","encoding":"base64","mode":"0755"}]`) ||
		!strings.Contains(bin, `"outputs":["out/*.csv"],"webhook_url":"https://hooks.acme.example/e"`) {
		t.Errorf("canonical %s", bin)
	}
	var req runRequest
	decodeBody([]byte(bin), &req)
	c, _ := req.validate(lim)
	spec := c.spec("org")
	if f := spec.Files[0]; f.Content != "#!/bin/sh\n" || f.Mode != 0o755 || spec.WebhookURL != "https://hooks.acme.example/e" || spec.Outputs[0] != "out/*.csv" {
		t.Errorf("spec %+v", spec)
	}
}

func TestWebhookSecretAndDeliveries(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	const withHook = `{"prompt":"p","max_cost_micros":1000,"webhook_url":"https://hooks.acme.example/ephemeral"}`
	if r := h.do("POST", "/v1/runs", withHook); r.status != http.StatusBadRequest || r.apiError(t).Code != "webhook_secret_missing" {
		t.Fatalf("run with a webhook before any secret: %d %s", r.status, r.body)
	}
	var secrets [2]struct {
		Object, Secret string
	}
	for i := range secrets {
		r := h.do("POST", "/v1/webhook_secret/rotate", "")
		r.decode(t, &secrets[i])
		if r.status != http.StatusOK || secrets[i].Object != "webhook_secret" || !strings.HasPrefix(secrets[i].Secret, "whsec_") ||
			r.header.Get("Cache-Control") != "no-store" {
			t.Fatalf("rotate: %d %s", r.status, r.body)
		}
	}
	if secrets[0].Secret == secrets[1].Secret {
		t.Error("rotation returned the same secret")
	}

	run := h.waitFinished(h.createRun(withHook).ID)
	var d struct {
		Object        string
		State         store.WebhookState
		NextAttemptAt *string `json:"next_attempt_at"`
		Data          []json.RawMessage
	}
	r := h.do("GET", "/v1/runs/"+run.ID+"/webhook_deliveries", "")
	r.decode(t, &d)
	// This harness has no deliverer: the delivery is due, not made.
	if r.status != http.StatusOK || d.Object != "list" || d.State != store.WebhookPending || d.NextAttemptAt == nil || len(d.Data) != 0 {
		t.Errorf("deliveries: %d %s", r.status, r.body)
	}
	plain := h.waitFinished(h.createRun(productPageRequest).ID)
	if r := h.do("GET", "/v1/runs/"+plain.ID+"/webhook_deliveries", ""); r.status != http.StatusNotFound || r.apiError(t).Code != "webhook_not_found" {
		t.Errorf("deliveries of a run without a webhook: %d %s", r.status, r.body)
	}
	// Another organisation neither sees the delivery nor shares the secret.
	_, otherKey := h.newOrg("globex", 1000)
	if r := h.do("GET", "/v1/runs/"+run.ID+"/webhook_deliveries", "", "Authorization", "Bearer "+otherKey); r.status != http.StatusNotFound {
		t.Errorf("another organisation's view: %d", r.status)
	}
	if r := h.do("POST", "/v1/runs", withHook, "Authorization", "Bearer "+otherKey); r.status != http.StatusBadRequest {
		t.Errorf("another organisation used the first one's secret: %d", r.status)
	}
}
