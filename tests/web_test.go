package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// requireBrowser skips (or, under EPHEMERAL_REQUIRE_VM=1, fails) a test
// that needs Debian's chromium, saying how to get it.
func requireBrowser(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err == nil {
		return path
	}
	testenv.Skip(t, "the browser tests need Debian's chromium (make deps, or apt-get install chromium)")
	return ""
}

// tab is a browser tab on the daemon at base.
type tab struct {
	t     *testing.T
	ctx   context.Context
	base  string
	shots string
	// dialogs counts the alert, confirm and prompt dialogs any page
	// opened: hostile content must never open one.
	dialogs *atomic.Int32
}

// newTab starts headless chromium with a fresh profile, quiet on the
// network (the machine's network is closed), and opens a tab.
func newTab(t *testing.T, chromium, base string) *tab {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	tb := &tab{t: t, ctx: ctx, base: base, shots: t.ArtifactDir(), dialogs: &atomic.Int32{}}
	// The first action starts the browser, which lives as long as the
	// context it ran with: that is the tab's own, with no deadline.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			tb.dialogs.Add(1)
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	// The count sees a dialog that a page opens.
	tb.do("open a dialog", chromedp.Evaluate[chromedp.Void](`setTimeout(() => alert("probe"), 0)`))
	for deadline := time.Now().Add(10 * time.Second); tb.dialogs.Load() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a dialog opened on purpose was not seen")
		}
	}
	tb.dialogs.Store(0)
	return tb
}

func (b *tab) open(path string) {
	b.t.Helper()
	b.openURL(b.base + path)
}

// actionTimeout bounds one browser action: a query waits for its element
// until then, so a missing element fails the test instead of hanging it.
const actionTimeout = time.Minute

// do runs browser actions within actionTimeout. An action that met a
// document being replaced (a page still loading after a navigation:
// chromium forgets the nodes of the old one) is tried again on the new
// one; on a loaded machine that happens between a navigation and the next
// action.
func (b *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, actionTimeout)
	defer cancel()
	for {
		err := chromedp.Do(ctx, actions...)
		if err == nil {
			return
		}
		if documentReplaced(err) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		b.shot("failed-" + regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(what), "-"))
		b.t.Fatalf("%s: %v", what, err)
	}
}

// documentReplaced reports whether err is chromium saying the node or the
// JavaScript context an action used belongs to a document that is gone.
func documentReplaced(err error) bool {
	msg := err.Error()
	for _, s := range []string{"No node with given id found", "Could not find node with given id",
		"Cannot find context with specified id", "Node with given id does not belong to the document", "Execution context was destroyed"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func (b *tab) openURL(url string) { b.t.Helper(); b.do("open "+url, chromedp.Navigate(url)) }

func (b *tab) click(css string) { b.t.Helper(); b.do("click "+css, chromedp.Click(chromedp.CSS(css))) }

func (b *tab) fill(css, value string) {
	b.t.Helper()
	b.do("fill "+css, chromedp.SetValue(chromedp.CSS(css), value))
}

// eval runs a JavaScript expression in the page and decodes its value.
func eval[T any](b *tab, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, actionTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// waitFor evaluates js until it is true; evaluations that fail (the page
// is being replaced) count as false.
func (b *tab) waitFor(what, js string, timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+js+")"))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.shot("timeout-" + regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(what), "-"))
			b.t.Fatalf("waited %v for %s (%s): %v", timeout, what, js, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *tab) text(css string) string {
	b.t.Helper()
	return eval[string](b, fmt.Sprintf(`(document.querySelector(%q) || {textContent: ""}).textContent`, css))
}

// shot saves a screenshot of the whole page as name.png in the test's
// output directory (go test -artifacts keeps it).
func (b *tab) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, actionTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Errorf("screenshot %s: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644); err != nil {
		b.t.Error(err)
	}
	// The README shows these two; -update refreshes them.
	if *update && (name == "example-page" || name == "playground") {
		if err := os.WriteFile(filepath.Join("..", "docs", name+".png"), png, 0o644); err != nil {
			b.t.Error(err)
		}
	}
}

// status fetches path from the page, with its cookies, and returns the
// HTTP status.
func (b *tab) status(path string) int {
	b.t.Helper()
	return eval[int](b, fmt.Sprintf(`fetch(%q).then(r => r.status)`, path))
}

// noHorizontalScroll checks the page at a phone's width (375 px).
func (b *tab) noHorizontalScroll(name string) {
	b.t.Helper()
	b.do("emulate a phone", chromedp.EmulateViewport(375, 812, chromedp.EmulateMobile))
	defer b.do("emulate a desktop", chromedp.EmulateViewport(1280, 900))
	b.do("wait for a frame", chromedp.Evaluate[chromedp.Void](`new Promise(r => requestAnimationFrame(() => r()))`, chromedp.EvalAwaitPromise))
	sizes := eval[[]int](b, `[document.documentElement.scrollWidth, window.innerWidth]`)
	if sizes[0] > sizes[1] {
		b.t.Errorf("%s at 375 px: the page is %d px wide, the window %d: it scrolls sideways", name, sizes[0], sizes[1])
	}
	b.shot(name + "-375px")
}

// hostileModel plays the model of the playground's live run: its first
// turn runs the page's first command and one that prints markup, its
// answer carries markup and a javascript: link besides the real results.
func hostileModel() http.Handler {
	// The sleep keeps the command running long enough to be seen so.
	printMarkup := `sleep 1; printf '%s\n' '<script>alert("cmd")</script>' '<img src=x onerror=alert("img")>'`
	return scriptedModel(fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{
		shellCall("call_1", pageWhoami), shellCall("call_2", printMarkup),
	}, Usage: fakeprovider.Usage{InputTokens: 1460, OutputTokens: 40}},
		func(results map[string]string) string {
			scratch := regexp.MustCompile(`/tmp/ephemeral-run-\S+/scratch`).FindString(results["call_1"])
			return "1. whoami: worker; pwd: " + scratch + "\n" +
				"2. The second command printed <script>alert('answer')</script>\n\n" +
				"<img src=x onerror=alert('answer-img')>\n\n[click here](javascript:alert('link'))"
		}, fakeprovider.Usage{InputTokens: 1700, OutputTokens: 90})
}

// attackerPage is another origin's page that, loaded in a signed-in
// browser, tries to start a run and create an API key with the browser's
// cookie.
func attackerPage(target string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><title>attacker</title>
<form id="f" method="post" action="%[1]s/account/keys"></form>
<script>
fetch(%[1]q + "/v1/runs", {method: "POST", mode: "no-cors", credentials: "include",
  headers: {"Content-Type": "text/plain"},
  body: JSON.stringify({prompt: "spend their money", shell: true, max_cost_micros: 40000})})
  .finally(() => { document.title = "sent"; document.getElementById("f").submit(); });
</script>`, target)
	})
}

// The web app in a real browser, against a real `ephemeral serve` with
// the fake model provider and real microVMs: two runs, one live and one a
// replay of the product page's recording.
func TestWebAppInABrowser(t *testing.T) {
	chromium := requireBrowser(t)
	state := cliState(t)
	model := httptest.NewServer(hostileModel())
	defer model.Close()
	d := launchServe(t, state, "", "EPHEMERAL_OPENAI_BASE_URL="+model.URL+"/v1", "EPHEMERAL_OPENAI_API_KEY=sk-test",
		"EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna")
	attacker := httptest.NewServer(attackerPage(d.url))
	defer attacker.Close()
	b := newTab(t, chromium, d.url)
	var pages []string // visited, for the phone-width pass

	var ex example.Example
	if data, err := os.ReadFile(filepath.Join(examplesDir, "product-page.json")); err != nil {
		t.Fatal(err)
	} else if ex, err = example.Parse(data); err != nil {
		t.Fatal(err)
	}

	t.Run("the front page replays the product page's run", func(t *testing.T) {
		b.t = t
		b.open("/")
		b.waitFor("playback", `document.querySelector('#timeline[data-playback-ready]')`, 10*time.Second)
		total := eval[int](b, `document.querySelectorAll('#timeline .row').length`)
		// Watch the rows appear as the recorded run's clock advances.
		var seen []int
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			n := eval[int](b, `document.querySelectorAll('#timeline .row:not(.pending)').length`)
			if len(seen) == 0 || n != seen[len(seen)-1] {
				seen = append(seen, n)
			}
			if n == total || time.Now().After(deadline) {
				break
			}
		}
		if len(seen) < 4 || seen[0] >= total || seen[len(seen)-1] != total {
			t.Fatalf("rows shown over time: %v of %d; want them to appear a few at a time", seen, total)
		}
		b.waitFor("the answer and cost line", `!document.querySelector('#result').classList.contains('pending') &&
			!document.querySelector('#cost').classList.contains('pending')`, 10*time.Second)
		if a := b.text("#answer"); !strings.Contains(a, "The network call did not succeed.") {
			t.Errorf("answer shown: %q", a)
		}
		if c := b.text("#costline"); c != "Model $0.00033 · Web $0.00 · Compute $0.0032" {
			t.Errorf("cost line %q", c)
		}
		b.shot("front")
		pages = append(pages, "/", "/examples/crm-lookup", "/examples/web-fetch")
	})

	t.Run("register, then run the example live from the playground", func(t *testing.T) {
		b.t = t
		b.open("/examples/product-page")
		b.click("[data-end]")
		b.shot("example-page")
		pages = append(pages, "/examples/product-page")
		b.click("#register-and-run")
		b.waitFor("the register page", `location.pathname === '/register'`, 10*time.Second)
		pages = append(pages, "/register", "/signin")
		b.fill(`input[name=email]`, "ada@example.org")
		b.fill(`input[name=password]`, "correct horse battery")
		b.click("#submit")
		b.waitFor("the playground", `document.querySelector('#playground[data-ready]')`, 10*time.Second)
		var got map[string]any
		json.Unmarshal([]byte(b.text("#pg-request")), &got)
		var want map[string]any
		json.Unmarshal(ex.Request, &want)
		for k, v := range want {
			if fmt.Sprint(got[k]) != fmt.Sprint(v) {
				t.Errorf("the playground's request has %s = %v, the example %v", k, got[k], v)
			}
		}
		if got["model"] != ex.Model() {
			t.Errorf("the playground's model %v, the example's %s", got["model"], ex.Model())
		}
		before := eval[int](b, `Number(document.getElementById('balance').dataset.micros)`)
		if before != 1_000_000 {
			t.Fatalf("balance after registering: %d micros, want the $1.00 starter credit", before)
		}
		// Commands appear when they start and are amended when they end.
		eval[chromedp.Void](b, `new MutationObserver(() => {
			if (document.querySelector('#pg-timeline .row.cat-shell.running')) window.sawRunning = true;
		}).observe(document.getElementById('pg-timeline'), {childList: true, subtree: true})`)
		b.click("#run")
		b.waitFor("the first command on the live timeline", `document.querySelector('#pg-timeline .row.cat-shell')`, 3*time.Minute)
		b.waitFor("the run's end", `document.querySelector('#pg-run[data-finished]')`, 4*time.Minute)
		if st := eval[string](b, `document.querySelector('#pg-run').dataset.finished`); st != "succeeded" {
			t.Fatalf("the live run ended %s: %s", st, b.text("#pg-run"))
		}
		if !eval[bool](b, `!!window.sawRunning`) {
			t.Error("no command was shown running before its result came")
		}
		timeline := b.text("#pg-timeline")
		for _, want := range []string{"$ " + pageWhoami, "/tmp/ephemeral-run-", "worker", "microVM destroyed", "2 model calls"} {
			if !strings.Contains(timeline, want) {
				t.Errorf("live timeline lacks %q:\n%s", want, timeline)
			}
		}
		// The markup the command printed and the answer wrote is text.
		if out := b.text("#pg-timeline"); !strings.Contains(out, `<script>alert("cmd")</script>`) || !strings.Contains(out, `<img src=x onerror=alert("img")>`) {
			t.Errorf("the command's output is not shown as text:\n%s", out)
		}
		answer := b.text("#answer")
		for _, want := range []string{"whoami: worker", "<script>alert('answer')</script>", "<img src=x onerror=alert('answer-img')>", "click here (javascript:alert('link'))"} {
			if !strings.Contains(answer, want) {
				t.Errorf("answer lacks the text %q:\n%s", want, answer)
			}
		}
		if n := eval[int](b, `document.querySelectorAll('#answer script, #answer img, #answer a[href^="javascript"], #pg-timeline script, #pg-timeline img').length`); n != 0 {
			t.Errorf("%d live elements made from hostile content", n)
		}
		charged := eval[int](b, `Number(document.getElementById('costline').dataset.charged)`)
		after := eval[int](b, `Number(document.getElementById('balance').dataset.micros)`)
		if charged <= 0 || before-after != charged {
			t.Errorf("balance went from %d to %d micros; the run charged %d", before, after, charged)
		}
		b.shot("playground")
		pages = append(pages, "/playground?example=product-page", "/playground")
	})

	var runPage string
	t.Run("replay the example from the playground", func(t *testing.T) {
		b.t = t
		b.open("/playground?example=product-page")
		b.waitFor("the playground", `document.querySelector('#playground[data-ready]')`, 10*time.Second)
		b.click(`input[name=replay]`)
		if !strings.Contains(b.text("#pg-request"), `"replay": "product-page"`) {
			t.Fatalf("request.json does not ask for the replay:\n%s", b.text("#pg-request"))
		}
		b.click("#run")
		b.waitFor("the replay's end", `document.querySelector('#pg-run[data-finished]')`, 4*time.Minute)
		timeline := b.text("#pg-timeline")
		for _, want := range []string{"replay: model answers come from a recording", "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47", "Could not resolve host: example.com"} {
			if !strings.Contains(timeline, want) {
				t.Errorf("replay timeline lacks %q:\n%s", want, timeline)
			}
		}
		if st := eval[string](b, `document.querySelector('#pg-run').dataset.finished`); st != "succeeded" {
			t.Errorf("the replay ended %s", st)
		}
		runPage = eval[string](b, `document.getElementById('run-link').getAttribute('href')`)
	})

	t.Run("publish a run, then unpublish it", func(t *testing.T) {
		b.t = t
		b.open(runPage)
		pages = append(pages, runPage, "/account/runs")
		b.click("#publish")
		b.waitFor("the public link", `document.querySelector('#public-link')`, 10*time.Second)
		link := eval[string](b, `document.getElementById('public-link').getAttribute('href')`)
		b.shot("run-page")
		b.click(`form[action="/signout"] button`)
		b.waitFor("signed out", `document.querySelector('a[href^="/signin"]')`, 10*time.Second)
		b.open(link)
		if h := b.text("h1"); !strings.HasPrefix(h, "Run run_") {
			t.Fatalf("public page signed out: %q", h)
		}
		b.click("[data-end]")
		if !strings.Contains(b.text("#timeline"), "replay: model answers come from a recording") {
			t.Errorf("the public page lacks the run's timeline")
		}
		b.shot("published")
		b.noHorizontalScroll("published")
		b.open("/signin")
		b.fill(`input[name=email]`, "ada@example.org")
		b.fill(`input[name=password]`, "correct horse battery")
		b.click("#submit")
		b.waitFor("the account page", `location.pathname === '/account'`, 10*time.Second)
		b.open(runPage)
		b.click(`form[action$="/unpublish"] button`)
		b.waitFor("the publish button", `document.querySelector('#publish')`, 10*time.Second)
		if s := b.status(link); s != http.StatusNotFound {
			t.Errorf("public link after unpublishing: %d", s)
		}
		pages = append(pages, link, "/account/password") // the first now the not-found page
	})

	var key, keyID string
	t.Run("create an API key, use it, revoke it", func(t *testing.T) {
		b.t = t
		b.open("/account")
		pages = append(pages, "/account")
		b.click("#create-key")
		b.waitFor("the new key", `document.querySelector('#new-key')`, 10*time.Second)
		key = strings.TrimSpace(b.text("#new-key"))
		b.shot("account")
		api := daemon{url: d.url, key: key}
		var list struct {
			Data []apiRun `json:"data"`
		}
		if status := api.call(t, "GET", "/v1/runs", nil, nil, &list); status != http.StatusOK || len(list.Data) != 2 {
			t.Fatalf("GET /v1/runs with the new key: %d, %d runs", status, len(list.Data))
		}
		keyID = strings.Split(strings.TrimPrefix(key, "eph_"), "_")[0]
		b.open("/account")
		if !strings.Contains(b.text("#keys"), "eph_"+keyID+"_…") {
			t.Errorf("keys list lacks the key's prefix: %s", b.text("#keys"))
		}
		b.click(fmt.Sprintf(`tr[data-key=%q] button`, keyID))
		b.waitFor("the revocation", `location.search === '?done=revoked'`, 10*time.Second)
		if status := api.call(t, "GET", "/v1/runs", nil, nil, nil); status != http.StatusUnauthorized {
			t.Errorf("GET /v1/runs with the revoked key: %d", status)
		}
	})

	t.Run("a second user sees neither the first one's runs nor keys", func(t *testing.T) {
		b.t = t
		runID := strings.TrimPrefix(runPage, "/account/runs/")
		b.open("/")
		b.click(`form[action="/signout"] button`)
		b.waitFor("signed out", `document.querySelector('a[href^="/register"]')`, 10*time.Second)
		b.open("/register")
		b.fill(`input[name=email]`, "bob@example.org")
		b.fill(`input[name=password]`, "another horse")
		b.click("#submit")
		b.waitFor("the playground", `location.pathname === '/playground'`, 10*time.Second)
		b.open(runPage)
		if h := b.text("h1"); h != "Not found" {
			t.Errorf("bob on ada's run page: %q", h)
		}
		for path, want := range map[string]int{"/v1/runs/" + runID: 404, runPage + "/result": 404, "/v1/runs": 200} {
			if s := b.status(path); s != want {
				t.Errorf("bob GET %s: %d, want %d", path, s, want)
			}
		}
		if n := eval[int](b, `fetch('/v1/runs').then(r => r.json()).then(l => l.data.length)`); n != 0 {
			t.Errorf("bob lists %d runs", n)
		}
		b.open("/account")
		if strings.Contains(b.text("main"), keyID) {
			t.Error("bob's account page shows ada's key")
		}
		if s := eval[int](b, fmt.Sprintf(`fetch('/account/keys/%s/revoke', {method: 'POST'}).then(r => r.status)`, keyID)); s != http.StatusNotFound {
			t.Errorf("bob revoking ada's key: %d", s)
		}
	})

	t.Run("a cross-site request with the session cookie is refused", func(t *testing.T) {
		b.t = t
		b.openURL(attacker.URL + "/")
		b.waitFor("the forged form's answer", `location.href.startsWith(`+fmt.Sprintf("%q", d.url)+`)`, 20*time.Second)
		if h := b.text("h1"); h != "Refused" {
			t.Errorf("the forged form got %q, want the refusal", h)
		}
		b.open("/account")
		if n := eval[int](b, `fetch('/v1/runs').then(r => r.json()).then(l => l.data.length)`); n != 0 {
			t.Errorf("the forged fetch started %d runs", n)
		}
		if b.text("#keys") != "" {
			t.Errorf("the forged form created a key: %s", b.text("#keys"))
		}
	})

	t.Run("every page fits a phone's width", func(t *testing.T) {
		b.t = t
		b.open("/")
		b.click(`form[action="/signout"] button`)
		b.waitFor("signed out", `document.querySelector('a[href^="/signin"]')`, 10*time.Second)
		b.open("/signin")
		b.fill(`input[name=email]`, "ada@example.org")
		b.fill(`input[name=password]`, "correct horse battery")
		b.click("#submit")
		b.waitFor("signed in", `location.pathname === '/account'`, 10*time.Second)
		for i, p := range pages {
			b.open(p)
			name := strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(p), "-"), "-")
			if name == "" {
				name = "front"
			}
			b.noHorizontalScroll(fmt.Sprintf("%02d-%s", i, name))
		}
	})

	if n := b.dialogs.Load(); n != 0 {
		t.Errorf("pages opened %d dialogs: hostile content ran", n)
	}
}
