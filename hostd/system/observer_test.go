package system

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

type executorFunc func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error)

func (f executorFunc) Execute(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	return f(ctx, spec, rec)
}

// staticResolver answers from a fixed table.
type staticResolver map[string]string

func (r staticResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
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
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from upstream") }))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	b := broker.New(broker.Config{
		Resolver:        staticResolver{"site.test": "127.0.0.1", "metadata.test": "169.254.169.254"},
		UnsafeTestHooks: &broker.TestHooks{AllowAddress: func(a netip.Addr) bool { return a.IsLoopback() }},
	})
	const price = 250
	svc := runs.New(st, timeline.NewHub(), runs.Config{Rates: ledger.Rates{WebMicrosPerRequest: price},
		Executor: executorFunc(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
			s, err := b.Open(ctx, grants(spec), RunObserver{Rec: rec})
			if err != nil {
				return runs.Result{}, err
			}
			defer s.Close()
			if _, err := s.Fetch(ctx, broker.Request{Method: "GET", URL: "http://site.test:" + u.Port() + "/"}); err != nil {
				return runs.Result{}, err
			}
			s.Fetch(ctx, broker.Request{Method: "GET", URL: "http://metadata.test/"})
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
	if len(web) != 2 || web[0] != "GET site.test:"+u.Port()+" → 200, 19 B" || !strings.HasPrefix(web[1], "GET metadata.test → 403 refused:") {
		t.Errorf("web events %q", web)
	}
}

func TestGrantsCarryTheRunsPermissions(t *testing.T) {
	g := grants(runs.Spec{OrgID: "org_1", Web: true, Connections: []runs.Connection{{Name: "crm", Methods: []string{"GET", "HEAD"}}}})
	if g.OrgID != "org_1" || !g.Web || len(g.Connections) != 1 || g.Connections[0].Name != "crm" || len(g.Connections[0].Methods) != 2 {
		t.Fatalf("%+v", g)
	}
	if grants(runs.Spec{OrgID: "org_1"}).NeedsBroker() {
		t.Fatal("a run with neither web nor connections needs a broker")
	}
}
