package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/httpcall"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// testModel is priced like the product page's model.
const testModel = "openai/gpt-6-luna"

// testAnthropicModel is served over the Anthropic Messages wire format.
const testAnthropicModel = "claude-test"

var testPrice = model.Price{InputMicrosPerMTok: 50_000, OutputMicrosPerMTok: 400_000}

// fakeVM stands in for a microVM: commands are answered by a script
// function, so these tests exercise the agent, not the guest (tests/ boots
// real VMs).
type fakeVM struct {
	answer func(ctx context.Context, command string) (stdout, stderr string, code int, err error)
	// ends, where it names a command, is how that command ends instead
	// of with answer's exit code.
	ends map[string]vsockproto.ExitStatus

	stopped chan struct{} // closed to play a VM that died
	// cause is why it died, as a sandbox tells it.
	cause error

	// listing, when set, is what ListOutputs answers, as a hostile
	// guest might; otherwise the files matching the patterns are listed.
	listing *vsockproto.OutputListing

	mu        sync.Mutex
	commands  []string
	files     map[string]string
	modes     map[string]uint32
	reads     []string // ReadOutput's paths, in order
	destroyed int
}

func (v *fakeVM) ScratchDir() string { return "/tmp/ephemeral-run-Fake01/scratch" }

func (v *fakeVM) Exec(ctx context.Context, req vsockproto.ExecRequest, _ io.Reader, stdout, stderr io.Writer) (vsockproto.ExitStatus, error) {
	command := req.Shell
	if command == "" {
		command = strings.Join(req.Argv, " ")
	}
	v.mu.Lock()
	v.commands = append(v.commands, command)
	v.mu.Unlock()
	out, errOut, code, err := "", "", 0, error(nil)
	if v.answer != nil {
		out, errOut, code, err = v.answer(ctx, command)
	}
	if err != nil {
		return vsockproto.ExitStatus{}, err
	}
	for _, w := range []struct {
		to   io.Writer
		text string
	}{{stdout, out}, {stderr, errOut}} {
		if w.to != nil {
			io.WriteString(w.to, w.text)
		}
	}
	if st, ok := v.ends[command]; ok {
		return st, nil
	}
	return vsockproto.ExitStatus{Code: code, Duration: time.Millisecond}, nil
}

func (v *fakeVM) Done() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopped == nil {
		v.stopped = make(chan struct{})
	}
	return v.stopped
}

func (v *fakeVM) StopCause() error { return v.cause }

func (v *fakeVM) WriteFile(_ context.Context, req vsockproto.FileRequest, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.files == nil {
		v.files, v.modes = map[string]string{}, map[string]uint32{}
	}
	v.files[req.Path] = string(b)
	v.modes[req.Path] = req.Mode
	return nil
}

func (v *fakeVM) ListOutputs(_ context.Context, req vsockproto.OutputsRequest) (vsockproto.OutputListing, error) {
	if v.listing != nil {
		return *v.listing, nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var l vsockproto.OutputListing
	for i, p := range req.Patterns {
		var names []string
		for name := range v.files {
			if ok, _ := path.Match(p, name); ok {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			l.Entries = append(l.Entries, vsockproto.OutputEntry{Pattern: i, Path: name, Kind: vsockproto.OutputFile, Size: int64(len(v.files[name]))})
		}
	}
	return l, nil
}

// ReadOutput sends the whole file whatever MaxBytes says: the host must
// hold its caps itself.
func (v *fakeVM) ReadOutput(_ context.Context, req vsockproto.FileRequest, w io.Writer) error {
	v.mu.Lock()
	content, ok := v.files[req.Path]
	v.reads = append(v.reads, req.Path)
	destroyed := v.destroyed
	v.mu.Unlock()
	switch {
	case destroyed > 0:
		return errors.New("read after the VM was destroyed")
	case !ok:
		return &vsockproto.GuestError{Op: "read_output", Message: "open " + req.Path + ": no such file or directory"}
	}
	_, err := io.WriteString(w, content)
	return err
}

func (v *fakeVM) Destroy() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.destroyed++
	return nil
}

// env is a runs service on a real database, with the agent driving a fake
// VM and a scripted model server over HTTP.
type env struct {
	t        testing.TB
	store    *store.Store
	hub      *timeline.Hub
	svc      *runs.Service
	orgID    string
	provider *fakeprovider.Server
	exec     *Executor
	vm       *fakeVM
	// broker, when set, serves the egress of runs granted web or
	// connections, reporting to the run like the daemon's does.
	broker *broker.Broker
	// firewall, when set, is the VM's firewall.
	firewall Firewall
}

func newEnv(t testing.TB, vm *fakeVM, script ...fakeprovider.Turn) *env {
	return newEnvConfig(t, Config{}, vm, script...)
}

// newEnvConfig is newEnv with the agent's limits from cfg.
func newEnvConfig(t testing.TB, cfg Config, vm *fakeVM, script ...fakeprovider.Turn) *env {
	t.Helper()
	return newEnvRuns(t, cfg, runs.Config{}, vm, script...)
}

// newEnvRuns is newEnvConfig with the runs service's size caps from rc.
func newEnvRuns(t testing.TB, cfg Config, rc runs.Config, vm *fakeVM, script ...fakeprovider.Turn) *env {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "ephemeral.db"))
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
	fake := fakeprovider.New(script...)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	reg, err := registry.New(registry.Config{
		OpenAI:    registry.ProviderConfig{BaseURL: srv.URL + "/v1"},
		Anthropic: registry.ProviderConfig{BaseURL: srv.URL},
		Models: []registry.ModelConfig{
			{Name: testModel, Provider: registry.ProviderOpenAI, Price: &testPrice},
			{Name: testAnthropicModel, Provider: registry.ProviderAnthropic, Price: &testPrice},
		},
		HTTP: httpcall.Client{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, store: st, orgID: org.ID, provider: fake, vm: vm}
	cfg.Boot = e.boot
	cfg.Models = reg
	exec, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.exec = exec
	e.hub = timeline.NewHub()
	e.svc = runs.New(st, e.hub, runs.Config{Executor: exec, Rates: ledger.DefaultRates,
		MaxRecordingBytes: rc.MaxRecordingBytes, MaxTimelineBytes: rc.MaxTimelineBytes})
	srvCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.svc.Serve(srvCtx, time.Hour) }()
	t.Cleanup(func() { stop(); <-done })
	return e
}

// boot hands out the env's fake VM, with a session of the env's broker when
// the run needs one.
func (e *env) boot(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (Machine, error) {
	m := Machine{VM: e.vm, Firewall: e.firewall}
	if e.broker == nil || !spec.NeedsEgress() {
		return m, nil
	}
	grants := broker.Grants{OrgID: spec.OrgID, Web: spec.Web}
	for _, c := range spec.Connections {
		grants.Connections = append(grants.Connections, broker.ConnectionGrant{Name: c.Name, Methods: c.Methods})
	}
	s, err := e.broker.Open(ctx, grants, recObserver{rec})
	if err != nil {
		return Machine{}, err
	}
	m.VM, m.Egress = &sessionVM{fakeVM: e.vm, session: s}, s
	return m, nil
}

// recObserver puts the broker's events on the run's timeline and bill, as
// the daemon's adapter (system.RunObserver) does.
type recObserver struct{ rec *runs.Recorder }

func (o recObserver) ChargeWeb() error { return o.rec.Charge(ledger.Usage{WebRequests: 1}) }

func (o recObserver) Record(e broker.Event) {
	category := timeline.Web
	if e.Connection != "" {
		category = timeline.Connection
	}
	o.rec.ContentEventAt(e.Start, category, e.Message(), map[string]any{"status": e.Status, "bytes": e.Bytes})
}

// sessionVM ends its broker session when destroyed, as the daemon's
// brokered sandboxes do.
type sessionVM struct {
	*fakeVM
	session *broker.Session
}

func (v *sessionVM) Destroy() error {
	v.session.Close()
	return v.fakeVM.Destroy()
}

// spec is the product page's permissions with the given prompt.
func pageSpec(prompt string) runs.Spec {
	return runs.Spec{Prompt: prompt, Model: testModel, Shell: true, Timeout: 120 * time.Second, MaxCostMicros: 40_000}
}

// run submits spec and waits until the run has ended.
func (e *env) run(spec runs.Spec) (store.Run, []store.Event) {
	e.t.Helper()
	ctx := context.Background()
	spec.OrgID = e.orgID
	canonical, _ := json.Marshal(spec)
	r, _, err := e.svc.Submit(ctx, runs.Submission{Spec: spec, Canonical: canonical})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.wait(r.ID)
}

// wait waits until the run has ended.
func (e *env) wait(runID string) (store.Run, []store.Event) {
	e.t.Helper()
	ctx := context.Background()
	giveUp := time.After(time.Minute)
	for {
		changed := e.hub.Changed(runID)
		r, err := e.store.GetRun(ctx, e.orgID, runID)
		if err != nil {
			e.t.Fatal(err)
		}
		if r.Status.Terminal() {
			events, err := e.store.Events(ctx, runID, 0, 1000)
			if err != nil {
				e.t.Fatal(err)
			}
			return r, events
		}
		select {
		case <-changed:
		case <-giveUp:
			e.t.Fatalf("run %s still %s after a minute", r.ID, r.Status)
		}
	}
}

// eventData decodes an event's data.
func eventData(t *testing.T, ev store.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if len(ev.Data) > 0 {
		if err := json.Unmarshal(ev.Data, &m); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func messages(events []store.Event) []string {
	var out []string
	for _, ev := range events {
		out = append(out, ev.Category+": "+ev.Message)
	}
	return out
}

func shellCall(id, command string) fakeprovider.ToolCall {
	args, _ := json.Marshal(map[string]string{"command": command})
	return fakeprovider.ToolCall{ID: id, Name: ShellTool, Arguments: string(args)}
}

// checkMoney asserts the ledger invariants a user can see on the run.
func checkMoney(t *testing.T, r store.Run) {
	t.Helper()
	if r.Reserved != r.Charged+r.Released {
		t.Errorf("reserved %d != charged %d + released %d", r.Reserved, r.Charged, r.Released)
	}
	if r.Cost.Total() != r.Charged {
		t.Errorf("cost parts %+v add up to %d, charged %d", r.Cost, r.Cost.Total(), r.Charged)
	}
	if r.Charged > r.Reserved {
		t.Errorf("charged %d over the limit %d", r.Charged, r.Reserved)
	}
}
