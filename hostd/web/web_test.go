package web

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/examples"
	"github.com/ephemeralhq/ephemeral/hostd/accounts"
	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

type fixture struct {
	t     *testing.T
	url   string
	store *store.Store
}

// newFixture serves the pages (with the security headers, as the daemon
// does) on a fresh database. provider says whether a model provider is
// configured.
func newFixture(t *testing.T, provider bool) *fixture {
	t.Helper()
	return newFixtureDefault(t, provider, "openai/gpt-6-luna")
}

// newFixtureDefault is newFixture with defaultModel as the daemon's
// default model ("": none).
func newFixtureDefault(t *testing.T, provider bool, defaultModel string) *fixture {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, err := seal.NewKey(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	conns := connections.NewRegistry(st, key)
	accts := accounts.New(st, accounts.Config{StarterCreditMicros: 1_000_000, KDF: accounts.Params{Time: 1, MemoryKiB: 64, Threads: 1},
		Provision: func(ctx context.Context, orgID string) error { return conns.Add(ctx, orgID, examplecrm.Connection()) }})
	set, err := example.Load(examples.Files)
	if err != nil {
		t.Fatal(err)
	}
	rc := registry.Config{}
	if provider {
		rc.OpenAI = registry.ProviderConfig{APIKey: "sk-test"}
	}
	models, err := registry.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: st, Accounts: accts, Examples: set, Models: models.Models, DefaultModel: defaultModel,
		Retention: 30 * 24 * time.Hour, StarterCreditMicros: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(SecurityHeaders(srv.Handler()))
	t.Cleanup(ts.Close)
	return &fixture{t: t, url: ts.URL, store: st}
}

// browser is a client with its own cookies that sends what a browser
// sends from this site's own pages.
type browser struct {
	f      *fixture
	client *http.Client
	lang   string
}

func (f *fixture) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{f: f, client: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) do(method, path string, form url.Values, header ...string) page {
	b.f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.f.url+path, body)
	if err != nil {
		b.f.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	if b.lang != "" {
		req.Header.Set("Accept-Language", b.lang)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, header: resp.Header, body: string(raw)}
}

func (b *browser) get(path string) page { return b.do("GET", path, nil) }

func (b *browser) post(path string, form url.Values) page {
	if form == nil {
		form = url.Values{}
	}
	return b.do("POST", path, form)
}

// register signs a new account in on this browser.
func (b *browser) register(email string) *store.User {
	b.f.t.Helper()
	p := b.post("/register", url.Values{"email": {email}, "password": {"correct horse"}, "next": {"/playground"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/playground" {
		b.f.t.Fatalf("register: %d %s", p.status, p.header.Get("Location"))
	}
	u, err := b.f.store.UserByEmail(context.Background(), email)
	if err != nil {
		b.f.t.Fatal(err)
	}
	return &u
}

func mustContain(t *testing.T, what, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
}

func TestPagesSendStrictSecurityHeadersAndNoInlineScript(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	b.register("ada@example.org")
	for _, path := range []string{"/", "/examples/product-page", "/playground", "/playground?example=product-page", "/account",
		"/account/runs", "/signin", "/register", "/nope"} {
		p := b.get(path)
		csp := p.header.Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "base-uri 'none'", "form-action 'self'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("%s: CSP %q lacks %s", path, csp, d)
			}
		}
		if p.header.Get("X-Content-Type-Options") != "nosniff" || p.header.Get("Referrer-Policy") == "" {
			t.Errorf("%s: headers %v", path, p.header)
		}
		// Scripts come from this origin's files only; the one data block
		// is JSON, which browsers do not run.
		for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAllString(p.body, -1) {
			if tag != `<script type="module" src="/static/js/main.js">` && tag != `<script type="application/json" id="i18n">` {
				t.Errorf("%s: script tag %s", path, tag)
			}
		}
		if m := regexp.MustCompile(`(src|href)="(https?:)?//`).FindString(p.body); m != "" {
			t.Errorf("%s: loads from another origin: %s", path, m)
		}
	}
	if p := b.get("/account"); p.header.Get("Cache-Control") != "no-store" {
		t.Errorf("account page cacheable: %q", p.header.Get("Cache-Control"))
	}
}

func TestEveryAssetIsEmbedded(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	err := fs.WalkDir(assets, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		resp := b.get("/" + p)
		want := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}[filepath.Ext(p)]
		if resp.status != http.StatusOK || resp.header.Get("Content-Type") != want {
			t.Errorf("%s: %d %s", p, resp.status, resp.header.Get("Content-Type"))
		}
		again := b.do("GET", "/"+p, nil, "If-None-Match", resp.header.Get("ETag"))
		if again.status != http.StatusNotModified {
			t.Errorf("%s with its ETag: %d", p, again.status)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every module a script imports is served.
	js, _ := fs.Glob(assets, "static/js/*.js")
	for _, name := range js {
		src, _ := assets.ReadFile(name)
		for _, m := range regexp.MustCompile(`from '\./([a-z]+\.js)'`).FindAllStringSubmatch(string(src), -1) {
			if _, err := assets.ReadFile("static/js/" + m[1]); err != nil {
				t.Errorf("%s imports %s, which is not embedded", name, m[1])
			}
		}
	}
}

// The example page has every section of the product page, in English and
// in German.
func TestExamplePageHasTheProductPagesSections(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	p := b.get("/examples/product-page")
	if p.status != http.StatusOK {
		t.Fatalf("example page: %d", p.status)
	}
	mustContain(t, "the English example page", p.body,
		"Run untrusted code safely: an AI agent in a disposable sandbox",
		"The agent writes and runs a script",
		"<li>Shell</li><li>Budget limit</li>",
		"run_de9af30ebaaa50ab76819bb536239c61",
		"$0.00353 of $0.04",
		"A real run from Oct 7, 2026, replayed. Model: openai/gpt-6-luna.",
		`data-t="5.25"`, "$ pwd; whoami", "Could not resolve host: example.com", "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47",
		"Budget $0.04 reserved", "3 model calls, 5,214 tokens", "$0.00353 charged, $0.03647 released",
		"Recorded output (English)", "<ol>", "Model $0.00033 · Web $0.00 · Compute $0.0032",
		"Run it yourself", "Budget for this example: $0.04", `href="/playground?example=product-page"`,
		"How it works", "Web access is off and the shell is on",
		"What the agent can and cannot do", "Off: the log is kept for 30 days", "$0.04, a hard limit", "120 seconds",
		"On, inside the isolated machine", "Credentials never enter the machine",
		"The code", `-H &#34;Idempotency-Key: $(uuidgen)&#34;`, `&#34;max_cost_micros&#34;: 40000`,
		"Play", "Jump to end")

	b.lang = "de-DE,de;q=0.9,en;q=0.8"
	p = b.get("/examples/product-page")
	mustContain(t, "the German example page", p.body, `<html lang="de">`,
		"Nicht vertrauenswürdigen Code sicher ausführen", "<li>Shell</li><li>Budgetlimit</li>",
		"Eine echte Ausführung ansehen", "Eine echte Ausführung vom 7. Okt. 2026, erneut abgespielt. Modell: openai/gpt-6-luna.",
		"$0.00353 von $0.04", "In Warteschlange", "Budget $0.04 reserviert", "3 Modellaufrufe, 5,214 Tokens",
		"Worker zerstört", "$0.00353 berechnet, $0.03647 freigegeben", "Aufgezeichnete Ausgabe (Englisch)",
		"Modell $0.00033 · Web $0.00 · Rechenleistung $0.0032", "Selbst ausführen", "Budget für dieses Beispiel: $0.04",
		"Im Playground öffnen", "Registrieren und ausführen", "So funktioniert es", "Was der Agent tun kann und was nicht",
		"Aus: Das Protokoll wird 30 Tage lang gespeichert", "An, innerhalb der abgeschotteten Maschine", "$0.04, ein festes Limit",
		"120 Sekunden", "Null-Datenspeicherung", "Der Code", "Vollständiger Anfragetext")

	// The switch wins over the browser's preference and returns to the
	// page, on this site only.
	p = b.get("/lang/en?next=/examples/product-page")
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/examples/product-page" {
		t.Fatalf("language switch: %d %q", p.status, p.header.Get("Location"))
	}
	if p = b.get("/examples/product-page"); !strings.Contains(p.body, `<html lang="en">`) {
		t.Error("the language picked does not stick")
	}
	for _, next := range []string{"//evil.example/x", "https://evil.example/", `/\evil.example`} {
		if p := b.get("/lang/de?next=" + url.QueryEscape(next)); p.header.Get("Location") != "/" {
			t.Errorf("next=%s redirected to %q", next, p.header.Get("Location"))
		}
	}
}

func TestEveryTextHasAnEnglishWording(t *testing.T) {
	used := map[string]bool{}
	key := regexp.MustCompile(`\bT "([a-z][a-zA-Z0-9. ]*)"|\.T\("([a-z][a-zA-Z0-9. ]*)"`)
	files, _ := filepath.Glob("templates/*.html")
	gofiles, _ := filepath.Glob("*.go")
	for _, name := range append(files, gofiles...) {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range key.FindAllStringSubmatch(string(src), -1) {
			if k := m[1] + m[2]; !strings.HasSuffix(k, ".") { // a prefix completed at run time
				used[k] = true
			}
		}
	}
	if len(used) < 50 {
		t.Fatalf("found only %d keys: the search is broken", len(used))
	}
	for k := range used {
		if _, ok := english[k]; !ok {
			t.Errorf("text %q has no English wording", k)
		}
	}
	for _, k := range jsKeys {
		if _, ok := english[k]; !ok {
			t.Errorf("script text %q has no English wording", k)
		}
	}
	for k := range german {
		if _, ok := english[k]; !ok {
			t.Errorf("German text %q has no English original", k)
		}
	}
}

func TestRegisterSignOutSignIn(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	b.register("ada@example.org")
	var session *http.Cookie
	u, _ := url.Parse(f.url)
	for _, c := range b.client.Jar.Cookies(u) {
		if c.Name == accounts.CookieName {
			session = c
		}
	}
	if session == nil {
		t.Fatal("no session cookie after registering")
	}
	p := b.get("/account")
	mustContain(t, "the account page", p.body, "ada@example.org", `id="balance-available">$1.00<`,
		"<code>example-crm</code>", "https://example-crm.internal/v1", "GET, HEAD")
	if strings.Contains(p.body, examplecrm.DemoToken) {
		t.Error("the account page shows a connection's secret")
	}
	// The raw Set-Cookie says what a cookie jar does not keep.
	raw := f.browser().post("/register", url.Values{"email": {"bob@example.org"}, "password": {"correct horse"}}).header.Get("Set-Cookie")
	for _, attr := range []string{"HttpOnly", "SameSite=Lax", "Path=/"} {
		if !strings.Contains(raw, attr) {
			t.Errorf("session cookie %q lacks %s", raw, attr)
		}
	}
	if strings.Contains(raw, "Secure") {
		t.Errorf("session cookie over plain http is Secure: %q", raw)
	}

	if p := b.post("/signout", nil); p.status != http.StatusSeeOther {
		t.Fatalf("sign out: %d", p.status)
	}
	if p := b.get("/account"); p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/signin?next=") {
		t.Errorf("account page signed out: %d %q", p.status, p.header.Get("Location"))
	}
	if p := b.post("/signin", url.Values{"email": {"ada@example.org"}, "password": {"wrong horse"}}); p.status != http.StatusUnauthorized ||
		!strings.Contains(p.body, "Wrong email or password.") {
		t.Errorf("wrong password: %d", p.status)
	}
	p = b.post("/signin", url.Values{"email": {"ada@example.org"}, "password": {"correct horse"}, "next": {"/account/runs"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/account/runs" {
		t.Fatalf("sign in: %d %q", p.status, p.header.Get("Location"))
	}
	if p := b.get("/account"); p.status != http.StatusOK {
		t.Errorf("account page signed in again: %d", p.status)
	}
	if p := b.post("/register", url.Values{"email": {"ADA@example.org"}, "password": {"another one"}}); p.status != http.StatusConflict {
		t.Errorf("registering a taken email: %d", p.status)
	}
}

func TestFailedSignInsAreRateLimited(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	b.register("ada@example.org")
	for range accounts.SignInFailuresPerAccount {
		b.post("/signin", url.Values{"email": {"ada@example.org"}, "password": {"guess"}})
	}
	p := b.post("/signin", url.Values{"email": {"ada@example.org"}, "password": {"correct horse"}})
	if p.status != http.StatusTooManyRequests || p.header.Get("Retry-After") == "" || !strings.Contains(p.body, "Too many failed attempts") {
		t.Errorf("sign-in after %d failures: %d Retry-After %q", accounts.SignInFailuresPerAccount, p.status, p.header.Get("Retry-After"))
	}
}

// finishedRun stores a finished run of org with a timeline and output, as
// the runs service would.
func finishedRun(t *testing.T, st *store.Store, orgID, id string, zeroRetention bool, output string, command, stdout string) {
	t.Helper()
	ctx := context.Background()
	req := `{"prompt":"p","model":"openai/gpt-6-luna","shell":true,"web":false,"connections":[],"files":[],"timeout_seconds":120,"max_cost_micros":40000,"zero_data_retention":false}`
	nr := store.NewRun{ID: id, OrgID: orgID, RequestHash: []byte(id), Model: "openai/gpt-6-luna", ZeroRetention: zeroRetention,
		TimeoutSeconds: 120, Reserve: 40000, CreatedAt: time.Now(), MaxActive: 10,
		Queued: store.Event{Category: "Queued", Message: "Budget $0.04 reserved", Data: json.RawMessage(`{"reserved_micros":40000}`)}}
	if !zeroRetention {
		nr.Request = json.RawMessage(req)
	}
	if _, _, err := st.CreateRun(ctx, nr); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(map[string]any{"command": command, "state": "done", "exit_code": 0, "duration_ms": 120, "stdout": stdout})
	if _, err := st.AppendEvent(ctx, id, store.Event{T: time.Second, Category: "Shell", Message: "$ " + command, Data: data, Content: true}); err != nil {
		t.Fatal(err)
	}
	f := store.Finish{Status: store.Succeeded, At: time.Now(), RetentionUntil: time.Now().Add(time.Hour)}
	if !zeroRetention {
		f.Output = &output
	}
	if _, err := st.FinishRun(ctx, id, f, func(charged, released int64) []store.Event {
		return []store.Event{{T: 2 * time.Second, Category: "Successful", Message: "1 model call, 10 tokens"}}
	}); err != nil {
		t.Fatal(err)
	}
}

const hostileAnswer = "Done. <script>alert('answer')</script>\n\n<img src=x onerror=alert('img')>\n\n[click me](javascript:alert('link'))"

func TestMembersSeeOnlyTheirOwnRunsAndKeys(t *testing.T) {
	f := newFixture(t, true)
	ada, bob := f.browser(), f.browser()
	adaUser := ada.register("ada@example.org")
	bob.register("bob@example.org")
	const runID = "run_0123456789abcdef0123456789abcdef"
	finishedRun(t, f.store, adaUser.OrgID, runID, false, "ada's answer", "echo hi", "hi\n")
	if p := ada.post("/account/keys", nil); p.status != http.StatusOK || !strings.Contains(p.body, `id="new-key">eph_`) {
		t.Fatalf("create key: %d", p.status)
	}
	keys, _ := f.store.Keys(context.Background(), adaUser.OrgID)
	if len(keys) != 1 {
		t.Fatalf("ada has %d keys", len(keys))
	}

	if p := ada.get("/account/runs/" + runID); p.status != http.StatusOK || !strings.Contains(p.body, "ada's answer") {
		t.Fatalf("ada's own run: %d", p.status)
	}
	for _, path := range []string{"/account/runs/" + runID, "/account/runs/" + runID + "/result"} {
		if p := bob.get(path); p.status != http.StatusNotFound {
			t.Errorf("bob GET %s: %d", path, p.status)
		}
	}
	for _, path := range []string{"/account/runs/" + runID + "/publish", "/account/runs/" + runID + "/delete", "/account/keys/" + keys[0].ID + "/revoke"} {
		if p := bob.post(path, nil); p.status != http.StatusNotFound {
			t.Errorf("bob POST %s: %d", path, p.status)
		}
	}
	if p := bob.get("/account"); strings.Contains(p.body, keys[0].ID) {
		t.Error("bob's account page lists ada's key")
	}
	if p := bob.get("/account/runs"); strings.Contains(p.body, runID[:12]) {
		t.Error("bob's runs list ada's run")
	}
	if k, _ := f.store.KeyByID(context.Background(), keys[0].ID); k.Revoked {
		t.Error("bob revoked ada's key")
	}
	if r, _ := f.store.GetRun(context.Background(), adaUser.OrgID, runID); r.PurgedAt != nil {
		t.Error("bob deleted ada's run")
	}
}

func TestCrossSiteFormsAreRefused(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	u := b.register("ada@example.org")
	for _, forged := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Sec-Fetch-Site", "same-site"}, {"Sec-Fetch-Site", "", "Origin", "http://evil.example"}} {
		p := b.do("POST", "/account/keys", url.Values{}, forged...)
		if p.status != http.StatusForbidden {
			t.Errorf("create key with %v: %d", forged, p.status)
		}
		if p := b.do("POST", "/signout", url.Values{}, forged...); p.status != http.StatusForbidden {
			t.Errorf("sign out with %v: %d", forged, p.status)
		}
	}
	if keys, _ := f.store.Keys(context.Background(), u.OrgID); len(keys) != 0 {
		t.Errorf("forged requests created %d keys", len(keys))
	}
	if p := b.get("/account"); p.status != http.StatusOK {
		t.Errorf("a forged sign-out signed the browser out: %d", p.status)
	}
}

func TestPublishedRunsArePublicUntilUnpublished(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	u := b.register("ada@example.org")
	const runID = "run_00000000000000000000000000000001"
	finishedRun(t, f.store, u.OrgID, runID, false, hostileAnswer, `echo '<script>alert("cmd")</script>'`, "<script>alert(\"out\")</script>\n")
	if p := b.post("/account/runs/"+runID+"/publish", nil); p.status != http.StatusSeeOther {
		t.Fatalf("publish: %d", p.status)
	}
	p := b.get("/account/runs/" + runID)
	link := regexp.MustCompile(`id="public-link">(/p/[A-Za-z0-9_-]{22})<`).FindStringSubmatch(p.body)
	if link == nil {
		t.Fatalf("run page shows no public link")
	}
	anon := f.browser()
	pub := anon.get(link[1])
	if pub.status != http.StatusOK {
		t.Fatalf("public page signed out: %d", pub.status)
	}
	// Hostile answer and command output are text.
	for _, page := range []string{pub.body, p.body} {
		mustContain(t, "the run page", page, "&lt;script&gt;alert('answer')&lt;/script&gt;",
			"&lt;img src=x onerror=alert('img')&gt;", "click me (javascript:alert(&#39;link&#39;))",
			"&lt;script&gt;alert(&#34;out&#34;)&lt;/script&gt;")
		for _, never := range []string{"<script>alert", "<img", "href=\"javascript", "onerror=alert('img')>"} {
			if strings.Contains(page, never) {
				t.Errorf("run page holds %q", never)
			}
		}
	}
	if strings.Contains(pub.body, "ada@example.org") || strings.Contains(pub.body, u.OrgID) {
		t.Error("the public page names the organisation")
	}
	if p := b.post("/account/runs/"+runID+"/unpublish", nil); p.status != http.StatusSeeOther {
		t.Fatalf("unpublish: %d", p.status)
	}
	if p := anon.get(link[1]); p.status != http.StatusNotFound {
		t.Errorf("public page after unpublishing: %d", p.status)
	}

	const zdrID = "run_00000000000000000000000000000002"
	finishedRun(t, f.store, u.OrgID, zdrID, true, "", "true", "")
	if p := b.post("/account/runs/"+zdrID+"/publish", nil); p.status != http.StatusConflict ||
		!strings.Contains(p.body, "zero data retention keeps nothing to show") {
		t.Errorf("publishing a zero-data-retention run: %d", p.status)
	}
	// Deleting the run's content ends its publication.
	b.post("/account/runs/"+runID+"/publish", nil)
	b.post("/account/runs/"+runID+"/delete", nil)
	if _, err := f.store.PublicationOf(context.Background(), u.OrgID, runID); err == nil {
		t.Error("a deleted run stays published")
	}
	if p := b.post("/account/runs/"+runID+"/publish", nil); p.status != http.StatusConflict {
		t.Errorf("publishing a deleted run: %d", p.status)
	}
}

func TestPlaygroundIsFilledFromAnExample(t *testing.T) {
	f := newFixture(t, true)
	b := f.browser()
	p := b.get("/playground?example=product-page")
	mustContain(t, "the playground", p.body, "This is a sandbox test. Do these steps with the shell",
		`<option value="openai/gpt-6-luna" selected>`, `name="shell" checked`, `value="0.04"`, `value="120"`,
		`value="example-crm GET"`, `name="replay" value="product-page">`, `id="register-and-run"`)
	if strings.Contains(p.body, `id="offline"`) {
		t.Error("the playground says no provider is configured")
	}
}

// Without a default model, the playground starts on the first usable
// model, and the request it shows names it.
func TestPlaygroundWithoutADefaultModel(t *testing.T) {
	f := newFixtureDefault(t, true, "")
	p := f.browser().get("/playground")
	// Sorted by name, "claude-…" come first, but only OpenAI has a key.
	mustContain(t, "the playground", p.body, `<option value="gpt-4.1" selected>`)
	if strings.Count(p.body, " selected>") != 1 {
		t.Errorf("not exactly one model selected")
	}
}

// Offline (no model provider), the playground says so, names the setting,
// and still runs examples as replays.
func TestPlaygroundOffline(t *testing.T) {
	f := newFixture(t, false)
	b := f.browser()
	b.register("ada@example.org")
	p := b.get("/playground?example=product-page")
	mustContain(t, "the offline playground", p.body, `id="offline"`, "No model provider is configured",
		"openai-api-key", "EPHEMERAL_OPENAI_API_KEY", `name="replay" value="product-page" checked disabled>`)
	if strings.Contains(p.body, `id="run" disabled`) {
		t.Error("an example's replay cannot run offline")
	}
	if p := b.get("/playground"); !strings.Contains(p.body, `id="run" disabled`) {
		t.Error("an empty request can run offline")
	}
}

func TestChangePasswordSignsOutOtherBrowsers(t *testing.T) {
	f := newFixture(t, true)
	here, there := f.browser(), f.browser()
	here.register("ada@example.org")
	if p := there.post("/signin", url.Values{"email": {"ada@example.org"}, "password": {"correct horse"}}); p.status != http.StatusSeeOther {
		t.Fatalf("sign in on the other browser: %d", p.status)
	}
	if p := here.post("/account/password", url.Values{"current": {"wrong horse"}, "new": {"battery staple"}}); p.status != http.StatusUnauthorized ||
		!strings.Contains(p.body, "The current password is wrong.") {
		t.Fatalf("change with the wrong password: %d", p.status)
	}
	p := here.post("/account/password", url.Values{"current": {"correct horse"}, "new": {"battery staple"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/account?done=password" {
		t.Fatalf("change password: %d %q", p.status, p.header.Get("Location"))
	}
	if p := here.get("/account?done=password"); p.status != http.StatusOK || !strings.Contains(p.body, "Password changed.") {
		t.Errorf("this browser after the change: %d", p.status)
	}
	if p := there.get("/account"); p.status != http.StatusSeeOther {
		t.Errorf("the other browser is still signed in: %d", p.status)
	}
	if p := there.post("/signin", url.Values{"email": {"ada@example.org"}, "password": {"battery staple"}}); p.status != http.StatusSeeOther {
		t.Errorf("sign in with the new password: %d", p.status)
	}
}
