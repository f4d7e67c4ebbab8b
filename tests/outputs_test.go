package tests

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/hostd/webhook"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// runOutputs is the outputs part of the run object.
type runOutputs struct {
	Status  string `json:"status"`
	Outputs []struct {
		Path        string `json:"path"`
		Size        int64  `json:"size"`
		SHA256      string `json:"sha256"`
		ContentType string `json:"content_type"`
		DownloadURL string `json:"download_url"`
	} `json:"outputs"`
}

// download fetches a path of the API with the daemon's key.
func download(t *testing.T, url, key string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body
}

// A run through the real daemon, in a real microVM: a binary input file
// and an executable one go in; the run writes a report, a CSV, a symlink
// to /etc/shadow and a file over the per-file cap; the report and the CSV
// come back, byte for byte, and the rest is skipped with a timeline entry
// each, before the VM is destroyed.
func TestOutputsOfARunInAMicroVM(t *testing.T) {
	state := cliState(t)
	blob := []byte{0, 1, 2, 0xfe, 0xff, '\n', 0x80}
	blobSum := sha256.Sum256(blob)
	const commands = `./gen.sh > report.md && mkdir -p out && printf 'a,b\n1,2\n' > out/a.csv && ln -s /etc/shadow out/link.csv && ` +
		`head -c 2000000 /dev/zero > out/big.csv && stat -c '%A %U' gen.sh && sha256sum blob.bin`
	fake, env := serveModel(t,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("make", commands)}},
		fakeprovider.Turn{Text: "The report is in report.md."},
	)
	d := startServe(t, state, append(env, "EPHEMERAL_MAX_OUTPUT_FILE_BYTES=1048576")...)
	request := fmt.Sprintf(`{"prompt": "Write the report.", "shell": true, "timeout_seconds": 180, "max_cost_micros": 40000,
		"files": [{"path": "gen.sh", "content": "#!/bin/sh\nprintf '# Report\\nall primes below 10: 2 3 5 7\\n'\n", "mode": "0755"},
		          {"path": "blob.bin", "content": %q, "encoding": "base64"}],
		"outputs": ["report.md", "out/*.csv", "missing/*.txt"]}`, base64.StdEncoding.EncodeToString(blob))
	run := d.submit(t, request)
	lines := run.messages()
	if run.Status != "succeeded" {
		t.Fatalf("run %s: %+v\n%s", run.Status, run.Error, strings.Join(lines, "\n"))
	}

	// The inputs arrived as given: the script ran, the binary is intact.
	got := resultsByID(fake.Requests()[1])["make"]
	if !strings.Contains(got, "exit code: 0") || !strings.Contains(got, "-rwxr-xr-x worker") || !strings.Contains(got, hex.EncodeToString(blobSum[:])) {
		t.Errorf("the command's result: %s", got)
	}

	var outputs []string
	for _, l := range lines {
		if strings.HasPrefix(l, "Output: ") || l == "MicroVM: microVM destroyed" {
			outputs = append(outputs, l)
		}
	}
	const report = "# Report\nall primes below 10: 2 3 5 7\n"
	want := []string{
		fmt.Sprintf("Output: kept report.md (%d bytes)", len(report)),
		"Output: kept out/a.csv (8 bytes)",
		"Output: skipped out/big.csv: 1.9 MiB over the 1 MiB per-file cap",
		"Output: skipped out/link.csv: a symbolic link (links are not followed)",
		"Output: nothing matches missing/*.txt",
		"MicroVM: microVM destroyed",
	}
	if !slices.Equal(outputs, want) {
		t.Errorf("timeline:\n%s\nwant:\n%s", strings.Join(outputs, "\n"), strings.Join(want, "\n"))
	}

	var obj runOutputs
	d.call(t, "GET", "/v1/runs/"+run.ID, nil, nil, &obj)
	wantFiles := map[string]string{"out/a.csv": "a,b\n1,2\n", "report.md": report}
	if len(obj.Outputs) != len(wantFiles) {
		t.Fatalf("outputs %+v", obj.Outputs)
	}
	for _, o := range obj.Outputs {
		status, header, body := download(t, d.url+o.DownloadURL, d.key)
		sum := sha256.Sum256(body)
		if status != http.StatusOK || string(body) != wantFiles[o.Path] || o.SHA256 != hex.EncodeToString(sum[:]) || o.Size != int64(len(body)) ||
			header.Get("Content-Type") != o.ContentType || header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %q %v (listed %+v)", o.Path, status, body, header, o)
		}
	}
	if obj.Outputs[1].ContentType != "text/markdown; charset=utf-8" {
		t.Errorf("report.md served as %q", obj.Outputs[1].ContentType)
	}

	// Deleting the run purges its outputs.
	if status := d.call(t, "DELETE", "/v1/runs/"+run.ID, nil, nil, nil); status != http.StatusOK {
		t.Fatalf("DELETE: %d", status)
	}
	if status, _, _ := download(t, d.url+obj.Outputs[0].DownloadURL, d.key); status != http.StatusNotFound {
		t.Errorf("download after DELETE: %d", status)
	}
}

// A zero-data-retention run with a webhook, in a real microVM, through
// the daemon's composition root (in-process, so that its deliverer can be
// given a resolver that reaches the test's receiver on loopback; no
// setting of the daemon relaxes the address policy): the receiver gets
// the run object signed with the organisation's secret, the output it
// lists is downloaded once and never stored.
func TestWebhookOfARunInAMicroVM(t *testing.T) {
	requireVM(t)
	ctx := context.Background()
	got := make(chan []byte, 4)
	signatures := make(chan string, 4)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		signatures <- r.Header.Get(webhook.SignatureHeader)
		got <- body
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	fake := fakeprovider.New(
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("write", `printf 'zdr result\n' > result.txt`)}},
		fakeprovider.Turn{Text: "done"},
	)
	model := httptest.NewServer(fake)
	defer model.Close()

	dir := t.TempDir()
	const modelName = "openai/test-model"
	models := filepath.Join(dir, "models.json")
	if err := os.WriteFile(models, []byte(`{"models": [{"name": "`+modelName+`", "provider": "openai",
		"price": {"input_micros_per_mtok": 50000, "output_micros_per_mtok": 400000}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.StateDir, cfg.OpenAIBaseURL, cfg.ModelsFile, cfg.MaxConcurrentRuns = stateDir(), model.URL+"/v1", models, 1
	cfg.DefaultModel = modelName
	sandboxes := filepath.Join(dir, "sandboxes")
	sys, err := system.New(ctx, cfg, system.Options{
		Database: filepath.Join(dir, "ephemeral.db"), SandboxDir: sandboxes, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		WebhookResolver:        staticResolver{netip.MustParseAddr("127.0.0.1")},
		UnsafeWebhookTestHooks: &webhook.TestHooks{AllowAddress: func(a netip.Addr) bool { return a.IsLoopback() }},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sys.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		assertNothingLeft(t, sandboxes)
	}()
	if err := sys.Start(ctx); err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(sys.API.Handler())
	defer api.Close()
	org, err := sys.Store.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	member, err := sys.Store.AddMember(ctx, org.ID, "dev@acme.example")
	if err != nil {
		t.Fatal(err)
	}
	key := auth.NewKey()
	if err := sys.Store.AddKey(ctx, member, key.ID, key.Hash); err != nil {
		t.Fatal(err)
	}
	if _, err := sys.Store.Credit(ctx, org.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	d := daemon{url: api.URL, key: key.Secret}
	var secret struct{ Secret string }
	if status := d.call(t, "POST", "/v1/webhook_secret/rotate", nil, nil, &secret); status != http.StatusOK {
		t.Fatalf("rotate: %d", status)
	}

	port := receiver.Listener.Addr().(*net.TCPAddr).Port
	var created apiRun
	status := d.call(t, "POST", "/v1/runs", strings.NewReader(fmt.Sprintf(`{"prompt": "Write result.txt.", "model": %q, "shell": true,
		"timeout_seconds": 180, "max_cost_micros": 40000, "zero_data_retention": true, "outputs": ["result.txt"],
		"webhook_url": "http://hooks.acme.example:%d/ephemeral"}`, modelName, port)), nil, &created)
	if status != http.StatusCreated {
		t.Fatalf("POST /v1/runs: %d %+v", status, created.Error)
	}

	var body []byte
	select {
	case body = <-got:
	case <-time.After(4 * time.Minute):
		t.Fatal("no webhook delivery within 4 minutes")
	}
	if err := webhook.Verify(secret.Secret, <-signatures, body, time.Now(), 5*time.Minute); err != nil {
		t.Fatalf("signature: %v", err)
	}
	var obj runOutputs
	if err := json.Unmarshal(body, &obj); err != nil {
		t.Fatal(err)
	}
	if obj.Status != "succeeded" || len(obj.Outputs) != 1 || obj.Outputs[0].Path != "result.txt" {
		t.Fatalf("delivered run object: %s", body)
	}
	if status, _, data := download(t, api.URL+obj.Outputs[0].DownloadURL, key.Secret); status != http.StatusOK || string(data) != "zdr result\n" {
		t.Errorf("first download: %d %q", status, data)
	}
	if status, _, _ := download(t, api.URL+obj.Outputs[0].DownloadURL, key.Secret); status != http.StatusNotFound {
		t.Errorf("second download of a zero-retention output: %d", status)
	}
	if listed, err := sys.Store.OutputsOf(ctx, []string{created.ID}); err != nil || len(listed[created.ID]) != 0 {
		t.Errorf("a zero-retention output was stored: %+v, %v", listed, err)
	}
	var deliveries struct {
		State string
		Data  []struct {
			StatusCode int `json:"status_code"`
		}
	}
	// The attempt is recorded right after the receiver answered.
	for deadline := time.Now().Add(time.Minute); deliveries.State != "delivered" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		d.call(t, "GET", "/v1/runs/"+created.ID+"/webhook_deliveries", nil, nil, &deliveries)
	}
	if deliveries.State != "delivered" || len(deliveries.Data) != 1 || deliveries.Data[0].StatusCode != http.StatusNoContent {
		t.Errorf("deliveries %+v", deliveries)
	}
}

type staticResolver []netip.Addr

func (r staticResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return r, nil
}
