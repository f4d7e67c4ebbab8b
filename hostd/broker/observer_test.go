package broker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

func TestEventMessages(t *testing.T) {
	for _, c := range []struct {
		e    Event
		want string
	}{
		{Event{Method: "GET", Host: "example.com", Status: 200, Bytes: 12_345}, "GET example.com → 200, 12 KB"},
		{Event{Method: "GET", Host: "example.com:8080", Status: 404, Bytes: 9}, "GET example.com:8080 → 404, 9 B"},
		{Event{Method: "CONNECT", Host: "pypi.org", Status: 200, Bytes: 3_400_000}, "CONNECT pypi.org → 200, 3.4 MB"},
		{Event{Connection: "crm", Method: "GET", Path: "/v1/customers", Status: 200, Bytes: 512}, "GET crm /v1/customers → 200"},
		{Event{Connection: "crm", Method: "POST", Path: "/v1/customers", Status: 403, Refused: "method POST is not granted"},
			"POST crm /v1/customers → 403 refused: method POST is not granted"},
		{Event{Method: "GET", Host: "big.test", Status: 200, Bytes: 1000, Err: "response body exceeds the broker's limit"},
			"GET big.test → 200, 1 KB, failed: response body exceeds the broker's limit"},
	} {
		if got := c.e.Message(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}

type executorFunc func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error)

func (f executorFunc) Execute(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	return f(ctx, spec, rec)
}

// Through RunObserver a web request lands on the run's timeline and its
// cost at the configured price; a refused one is on the timeline, free.
func TestRunObserverRecordsAndMetersOnTheRun(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	org, _ := st.CreateOrg(ctx, "acme")
	if _, err := st.Credit(ctx, org.ID, 1_000_000); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, false, hello)
	b := New(webConfig(newTestResolver("site.test", "127.0.0.1", "metadata.test", "169.254.169.254")))
	const price = 250
	svc := runs.New(st, timeline.NewHub(), runs.Config{Rates: ledger.Rates{WebMicrosPerRequest: price},
		Executor: executorFunc(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
			s, err := b.Open(ctx, GrantsOf(spec), RunObserver{Rec: rec})
			if err != nil {
				return runs.Result{}, err
			}
			defer s.Close()
			if _, err := s.Fetch(ctx, Request{Method: "GET", URL: "http://site.test:" + up.port() + "/"}); err != nil {
				return runs.Result{}, err
			}
			s.Fetch(ctx, Request{Method: "GET", URL: "http://metadata.test/"})
			return runs.Result{Output: "done"}, nil
		})})
	run, _, err := svc.Submit(ctx, runs.Submission{Spec: runs.Spec{OrgID: org.ID, Prompt: "p", Model: "m", Web: true,
		Timeout: time.Minute, MaxCostMicros: 10_000}, Canonical: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	for !run.Status.Terminal() {
		time.Sleep(10 * time.Millisecond)
		if run, err = st.GetRun(ctx, org.ID, run.ID); err != nil {
			t.Fatal(err)
		}
	}
	if run.Status != store.Succeeded || run.Usage.WebRequests != 1 || run.Cost.Web != price {
		t.Errorf("run %s: %d web requests costing %d, want 1 costing %d (error %s)", run.Status, run.Usage.WebRequests, run.Cost.Web, price, run.ErrorMessage)
	}
	events, err := st.Events(ctx, run.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var web []string
	for _, e := range events {
		if e.Category == timeline.Web {
			web = append(web, e.Message)
		}
	}
	port := up.port()
	if len(web) != 2 || web[0] != "GET site.test:"+port+" → 200, 19 B" || !strings.HasPrefix(web[1], "GET metadata.test → 403 refused:") {
		t.Errorf("web events %q", web)
	}
}
