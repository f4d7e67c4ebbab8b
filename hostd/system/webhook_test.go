package system

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/hostd/webhook"
)

// delivery is one POST a test receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// webhookReceiver serves on loopback and hands over what it is sent; the
// daemon reaches it by a name only the test's resolver knows.
func webhookReceiver(t *testing.T) (url string, got <-chan delivery, opts Options) {
	t.Helper()
	ch := make(chan delivery, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ch <- delivery{r.Header.Clone(), body}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	opts = Options{
		WebhookResolver:        resolveTo(netip.MustParseAddr("127.0.0.1")),
		UnsafeWebhookTestHooks: &webhook.TestHooks{AllowAddress: func(a netip.Addr) bool { return a.IsLoopback() }},
	}
	return "http://hooks.acme.example:" + strconv.Itoa(port) + "/ephemeral", ch, opts
}

type resolveTo netip.Addr

func (r resolveTo) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.Addr(r)}, nil
}

func receive(t *testing.T, got <-chan delivery) delivery {
	t.Helper()
	select {
	case d := <-got:
		return d
	case <-time.After(time.Minute):
		t.Fatal("no webhook delivery within a minute")
		return delivery{}
	}
}

// newWebhookSystem starts a daemon on a fresh state directory with an
// organisation that has credit and a webhook secret.
func newWebhookSystem(t *testing.T, state string, opts Options) (*System, string, string) {
	t.Helper()
	ctx := context.Background()
	cfg := config.Defaults()
	cfg.StateDir = state
	sys, err := New(ctx, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Close() })
	org, err := sys.Store.OrgByName(ctx, "acme")
	if err != nil {
		if org, err = sys.Store.CreateOrg(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if _, err := sys.Store.Credit(ctx, org.ID, 1_000_000); err != nil {
			t.Fatal(err)
		}
		if _, _, err := sys.WebhookSecrets.Rotate(ctx, org.ID); err != nil {
			t.Fatal(err)
		}
	}
	secret, err := sys.WebhookSecrets.Secret(ctx, org.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sys, org.ID, secret
}

// When a run ends, its webhook receives the run object as the API shows
// it, outputs listed, signed with the organisation's secret.
func TestWebhookCarriesTheSignedRunObject(t *testing.T) {
	ctx := context.Background()
	url, got, opts := webhookReceiver(t)
	opts.Executor = executorFunc(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		return runs.Result{Output: "done"}, rec.Output("report.md", []byte("# report\n"))
	})
	sys, orgID, secret := newWebhookSystem(t, filepath.Join(t.TempDir(), "state"), opts)
	if err := sys.Start(ctx); err != nil {
		t.Fatal(err)
	}
	run, _, err := sys.Runs.Submit(ctx, runs.Submission{Spec: runs.Spec{OrgID: orgID, Prompt: "p", Model: "m", Timeout: time.Minute,
		MaxCostMicros: 1000, WebhookURL: url}, Canonical: []byte(`{"prompt":"p"}`)})
	if err != nil {
		t.Fatal(err)
	}
	d := receive(t, got)
	if err := webhook.Verify(secret, d.header.Get(webhook.SignatureHeader), d.body, time.Now(), time.Minute); err != nil {
		t.Fatalf("signature: %v", err)
	}
	var obj struct {
		ID, Object, Status, Output string
		Outputs                    []struct{ Path, DownloadURL string }
	}
	if err := json.Unmarshal(d.body, &obj); err != nil {
		t.Fatal(err)
	}
	want, err := sys.API.RunObject(ctx, orgID, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if obj.ID != run.ID || obj.Object != "run" || obj.Status != "succeeded" || obj.Output != "done" || len(obj.Outputs) != 1 ||
		d.header.Get(webhook.IDHeader) != run.ID || string(want) != string(d.body) {
		t.Errorf("delivery %s %s\nwant %s", d.header, d.body, want)
	}
}

// A run that a dead daemon left running still gets its webhook: the next
// daemon ends it at start-up, in the same transaction as its delivery is
// made due, and delivers it.
func TestWebhookOfARunLeftByADeadDaemonIsDelivered(t *testing.T) {
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state")
	url, got, opts := webhookReceiver(t)
	opts.Executor = executorFunc(func(context.Context, runs.Spec, *runs.Recorder) (runs.Result, error) {
		t.Error("a recovered run was executed")
		return runs.Result{}, nil
	})
	opts.Reconcile = func(context.Context, []string) error { return nil }

	// The dead daemon's work: a run queued with its webhook and started,
	// never finished.
	dead, orgID, secret := newWebhookSystem(t, state, opts)
	const runID = "run_0123456789abcdef0123456789abcdef"
	if _, _, err := dead.Store.CreateRun(ctx, store.NewRun{ID: runID, OrgID: orgID, RequestHash: []byte("h"), Model: "m",
		TimeoutSeconds: 60, Reserve: 1000, CreatedAt: time.Now(), MaxActive: 10, WebhookURL: url,
		Queued: store.Event{Category: timeline.Queued, Message: timeline.Reserved(1000)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Store.MarkRunning(ctx, runID, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	dead.Close() // never started: nothing of it finishes the run

	next, _, _ := newWebhookSystem(t, state, opts)
	if err := next.Start(ctx); err != nil {
		t.Fatal(err)
	}
	d := receive(t, got)
	if err := webhook.Verify(secret, d.header.Get(webhook.SignatureHeader), d.body, time.Now(), time.Minute); err != nil {
		t.Fatalf("signature: %v", err)
	}
	var obj struct {
		ID, Status string
		Error      struct{ Code string }
	}
	json.Unmarshal(d.body, &obj)
	if obj.ID != runID || obj.Status != "failed" || obj.Error.Code != "daemon_restarted" {
		t.Errorf("delivery %s", d.body)
	}
}
