package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

func TestSignatureVerifies(t *testing.T) {
	const secret = "whsec_test"
	body := []byte(`{"id":"run_1","status":"succeeded"}`)
	now := time.Unix(1_750_000_000, 0)
	header := Sign(secret, now, body)
	if !strings.HasPrefix(header, "t=1750000000,v1=") || len(header) != len("t=1750000000,v1=")+64 {
		t.Fatalf("header %q", header)
	}
	if err := Verify(secret, header, body, now.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatalf("valid signature: %v", err)
	}
	other := Sign("whsec_other", now, body)
	for name, tc := range map[string]struct {
		secret, header string
		body           []byte
		at             time.Time
	}{
		"tampered body":     {secret, header, []byte(`{"id":"run_1","status":"failed"}`), now},
		"wrong secret":      {"whsec_other", header, body, now},
		"replayed too late": {secret, header, body, now.Add(6 * time.Minute)},
		"from the future":   {secret, header, body, now.Add(-6 * time.Minute)},
		"no timestamp":      {secret, strings.Replace(header, "t=", "x=", 1), body, now},
		"timestamp changed": {secret, strings.Replace(header, "t=1750000000", "t=1750000001", 1), body, now},
		"no signature":      {secret, "t=1750000000", body, now},
	} {
		if err := Verify(tc.secret, tc.header, tc.body, tc.at, 5*time.Minute); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", name, err)
		}
	}
	// Of several v1 signatures one valid one suffices.
	both := header + "," + strings.Split(other, ",")[1]
	if err := Verify(secret, both, body, now, time.Minute); err != nil {
		t.Errorf("two signatures, one valid: %v", err)
	}
}

func TestBackoffSpreadsSixAttemptsOverAnHour(t *testing.T) {
	var total time.Duration
	want := []time.Duration{30 * time.Second, 90 * time.Second, 270 * time.Second, 810 * time.Second, 2430 * time.Second}
	for n := 1; n < DefaultAttempts; n++ {
		d := Backoff(DefaultFirstRetry, n, 0.5)
		if d != want[n-1] {
			t.Errorf("wait after attempt %d: %v, want %v", n, d, want[n-1])
		}
		if lo, hi := Backoff(DefaultFirstRetry, n, 0), Backoff(DefaultFirstRetry, n, 0.999999); lo != d*8/10 || hi < d*119/100 || hi > d*12/10 {
			t.Errorf("jitter after attempt %d: %v to %v around %v", n, lo, hi, d)
		}
		total += d
	}
	if total < 55*time.Minute || total > 65*time.Minute {
		t.Errorf("six attempts span %v, want about an hour", total)
	}
}

func TestParseURL(t *testing.T) {
	for _, ok := range []string{"https://hooks.acme.example/ephemeral", "http://hooks.acme.example/x?y=1", "https://hooks.acme.example:8443/x",
		"https://93.184.216.34/hook", "https://[2606:2800:220:1:248:1893:25c8:1946]/hook", "https://hooks.acme.example:443/x", "https://xn--bcher-kva.example/x"} {
		if _, err := ParseURL(ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{
		"", "hooks.acme.example/x", "ftp://hooks.acme.example/", "file:///etc/passwd", "https:opaque", "https://",
		"https://user:pw@hooks.acme.example/", "https://hooks.acme.example/#frag", "https://hooks.acme.example:25/",
		"https://hooks.acme.example:0/", "https://hooks.acme.example:70000/", "http://127.0.0.1:8080/", "https://[::1]/",
		"http://169.254.169.254/latest/meta-data/", "http://[::ffff:10.0.0.1]/", "https://10.0.0.1:8443/", "https://[fe80::1%25eth0]/",
		"https://localhost/", "https://api.localhost/", "https://127.1/", "https://0x7f000001/", "https://1.2.3.4.5/",
		"https://hooks_.acme.example..com/", "https://hööks.example/", "https://" + strings.Repeat("a", 2050) + ".example/",
	} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// fixture is a store with one organisation whose secret is rotated, and
// a finished run of it that named webhook_url.
type fixture struct {
	st      *store.Store
	secrets *Secrets
	secret  string
	orgID   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, org.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	key, err := seal.NewKey(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{st: st, secrets: NewSecrets(st, key), orgID: org.ID}
	if f.secret, _, err = f.secrets.Rotate(ctx, org.ID); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) finishedRun(t *testing.T, id, url string) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := f.st.CreateRun(ctx, store.NewRun{ID: id, OrgID: f.orgID, RequestHash: []byte(id), Model: "m", TimeoutSeconds: 60,
		Reserve: 1000, CreatedAt: time.Now(), MaxActive: 10, Queued: store.Event{Category: "Queued", Message: "queued"}, WebhookURL: url}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.FinishRun(ctx, id, store.Finish{Status: store.Succeeded, At: time.Now(), RetentionUntil: time.Now().Add(time.Hour)},
		func(int64, int64) []store.Event { return nil }); err != nil {
		t.Fatal(err)
	}
}

// deliverer runs a Deliverer on the fixture until the test ends.
func (f *fixture) deliverer(t *testing.T, cfg Config) *Deliverer {
	t.Helper()
	cfg.Store, cfg.Secrets = f.st, f.secrets
	cfg.Render = func(ctx context.Context, orgID, runID string) ([]byte, error) {
		return []byte(fmt.Sprintf(`{"id":%q,"object":"run","status":"succeeded"}`, runID)), nil
	}
	d := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// waitEnded waits until the run's delivery has ended.
func (f *fixture) waitEnded(t *testing.T, runID string) (store.WebhookDelivery, []store.WebhookAttempt) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d, attempts, err := f.st.Webhook(context.Background(), runID)
		if err != nil {
			t.Fatal(err)
		}
		if d.State == store.WebhookDelivered || d.State == store.WebhookFailed {
			return d, attempts
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivery of %s still %s after %d attempts", runID, d.State, d.Attempts)
		}
	}
}

func (f *fixture) lastEvent(t *testing.T, runID string) string {
	t.Helper()
	events, err := f.st.Events(context.Background(), runID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1]
	return last.Category + ": " + last.Message
}

// resolverTo resolves every name to addrs.
type resolverTo []netip.Addr

func (r resolverTo) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) { return r, nil }

// receiver records what it is sent and answers with the next status.
type receiver struct {
	mu       sync.Mutex
	statuses []int
	got      []*http.Request
	bodies   [][]byte
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.got, rc.bodies = append(rc.got, r), append(rc.bodies, body)
	status := http.StatusOK
	if len(rc.statuses) > 0 {
		status, rc.statuses = rc.statuses[0], rc.statuses[1:]
	}
	if status == http.StatusFound {
		w.Header().Set("Location", "/elsewhere")
	}
	w.WriteHeader(status)
}

var loopback = resolverTo{netip.MustParseAddr("127.0.0.1")}

func allowLoopback() *TestHooks {
	return &TestHooks{AllowAddress: func(a netip.Addr) bool { return a.IsLoopback() }}
}

// A receiver that fails once gets the delivery again after the backoff;
// each POST is signed with the organisation's secret, every attempt is
// recorded and the outcome is on the run's timeline.
func TestDeliveryIsSignedRetriedAndRecorded(t *testing.T) {
	f := newFixture(t)
	rc := &receiver{statuses: []int{http.StatusServiceUnavailable, http.StatusNoContent}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	const runID = "run_hook_retry"
	f.finishedRun(t, runID, fmt.Sprintf("http://hooks.acme.example:%d/ephemeral?src=test", port))
	f.deliverer(t, Config{Resolver: loopback, UnsafeTestHooks: allowLoopback(), FirstRetry: 20 * time.Millisecond})

	d, attempts := f.waitEnded(t, runID)
	if d.State != store.WebhookDelivered || len(attempts) != 2 || attempts[0].StatusCode != 503 || attempts[1].StatusCode != 204 ||
		!strings.Contains(attempts[0].Error, "503") || attempts[1].Error != "" || d.URL != "" {
		t.Fatalf("delivery %+v, attempts %+v", d, attempts)
	}
	if got := f.lastEvent(t, runID); got != "Webhook: webhook delivered: 204 after 2 attempts" {
		t.Errorf("timeline ends with %q", got)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.got) != 2 {
		t.Fatalf("receiver got %d requests", len(rc.got))
	}
	for i, r := range rc.got {
		if r.Method != http.MethodPost || r.URL.Path != "/ephemeral" || r.URL.RawQuery != "src=test" || r.Host != fmt.Sprintf("hooks.acme.example:%d", port) ||
			r.Header.Get("Content-Type") != "application/json" || r.Header.Get(IDHeader) != runID || r.Header.Get(AttemptHeader) != fmt.Sprint(i+1) {
			t.Errorf("request %d: %s %s host %s headers %v", i, r.Method, r.URL, r.Host, r.Header)
		}
		if err := Verify(f.secret, r.Header.Get(SignatureHeader), rc.bodies[i], time.Now(), time.Minute); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
		if !strings.Contains(string(rc.bodies[i]), `"id":"`+runID+`"`) {
			t.Errorf("body %s", rc.bodies[i])
		}
	}
}

// Redirects are not followed: a 302 is a failed attempt, and after the
// last attempt the delivery has failed.
func TestRedirectIsNotFollowed(t *testing.T) {
	f := newFixture(t)
	rc := &receiver{statuses: []int{http.StatusFound, http.StatusFound}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	const runID = "run_hook_redirect"
	f.finishedRun(t, runID, "http://hooks.acme.example:"+strings.Split(srv.Listener.Addr().String(), ":")[1]+"/x")
	f.deliverer(t, Config{Resolver: loopback, UnsafeTestHooks: allowLoopback(), Attempts: 2, FirstRetry: time.Millisecond})
	d, attempts := f.waitEnded(t, runID)
	if d.State != store.WebhookFailed || len(attempts) != 2 || attempts[1].StatusCode != 302 {
		t.Fatalf("delivery %+v, attempts %+v", d, attempts)
	}
	if got := f.lastEvent(t, runID); got != "Webhook: webhook failed after 2 attempts (last: 302)" {
		t.Errorf("timeline ends with %q", got)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, r := range rc.got {
		if r.URL.Path != "/x" {
			t.Errorf("a redirect was followed to %s", r.URL.Path)
		}
	}
}

// Without the test hook, a receiver whose name resolves to loopback, a
// private or a metadata address (or to any such among others) is never
// dialled, whatever the URL said.
func TestDeliveryRefusesForbiddenAddresses(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	port := strings.Split(srv.Listener.Addr().String(), ":")[1]
	for name, addrs := range map[string]resolverTo{
		"loopback":        {netip.MustParseAddr("127.0.0.1")},
		"private":         {netip.MustParseAddr("10.1.2.3")},
		"metadata":        {netip.MustParseAddr("169.254.169.254")},
		"mapped loopback": {netip.MustParseAddr("::ffff:127.0.0.1")},
		"one of several":  {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("127.0.0.1")},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			runID := "run_hook_" + strings.ReplaceAll(name, " ", "_")
			f.finishedRun(t, runID, "http://hooks.acme.example:"+port+"/x")
			f.deliverer(t, Config{Resolver: addrs, Attempts: 1, Timeout: 2 * time.Second})
			d, attempts := f.waitEnded(t, runID)
			if d.State != store.WebhookFailed || len(attempts) != 1 || attempts[0].StatusCode != 0 ||
				!strings.Contains(attempts[0].Error, broker.ErrForbiddenAddress.Error()) {
				t.Fatalf("delivery %+v, attempts %+v", d, attempts)
			}
			if got := f.lastEvent(t, runID); got != "Webhook: webhook failed after 1 attempt (last: address not allowed)" {
				t.Errorf("timeline ends with %q", got)
			}
		})
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.got) != 0 {
		t.Errorf("the receiver on loopback was reached %d times", len(rc.got))
	}
}

func TestSecretsAreSealedAndRotated(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	got, err := f.secrets.Secret(ctx, f.orgID)
	if err != nil || got != f.secret || !strings.HasPrefix(got, SecretPrefix) || len(got) != len(SecretPrefix)+64 {
		t.Fatalf("secret %q, %v", got, err)
	}
	sealed, _, _ := f.st.WebhookSecret(ctx, f.orgID)
	if strings.Contains(string(sealed), f.secret[len(SecretPrefix):]) {
		t.Error("the secret is stored in the clear")
	}
	rotated, _, err := f.secrets.Rotate(ctx, f.orgID)
	if err != nil || rotated == f.secret {
		t.Fatalf("rotated %q, %v", rotated, err)
	}
	if got, _ := f.secrets.Secret(ctx, f.orgID); got != rotated {
		t.Errorf("after rotation the secret is %q", got)
	}
	other, err := f.st.CreateOrg(ctx, "globex")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.secrets.Secret(ctx, other.ID); !errors.Is(err, ErrNoSecret) {
		t.Errorf("secret of an organisation without one: %v", err)
	}
	// A sealed secret copied to another organisation does not open.
	if err := f.st.SetWebhookSecret(ctx, other.ID, sealed, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.secrets.Secret(ctx, other.ID); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("a secret moved to another organisation: %v", err)
	}
}
