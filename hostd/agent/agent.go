// Package agent is the runs.Executor that makes a run real: it boots the
// run's microVM, lets the requested model drive the tools the run was
// granted (the shell inside the VM; web_fetch and connection_request
// through the run's broker session), meters every model call and every
// VM-second against the budget, and always destroys the VM — after copying
// out the files the run asked to keep (outputs.go) and putting on the
// timeline what the VM's firewall dropped, if anything. The run's timeout
// and its compute both start when the VM is ready. A provider that refuses
// the daemon's key or model ends the run at once, saying what to fix
// (refusal.go); MinimumBudget is the least budget a run can get its
// model's first answer with.
//
// Everything the model returns is hostile: malformed or oversized tool
// arguments, unknown tools and tools the run was not granted are answered
// to the model as tool errors, never executed and never a crash.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// VM is what the agent needs of a run's microVM (a *sandbox.Sandbox).
type VM interface {
	// ScratchDir is where the worker's commands run.
	ScratchDir() string
	Exec(ctx context.Context, req vsockproto.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (vsockproto.ExitStatus, error)
	WriteFile(ctx context.Context, req vsockproto.FileRequest, r io.Reader) error
	// ListOutputs and ReadOutput copy the run's output files out.
	ListOutputs(ctx context.Context, req vsockproto.OutputsRequest) (vsockproto.OutputListing, error)
	ReadOutput(ctx context.Context, req vsockproto.FileRequest, w io.Writer) error
	// Done is closed when the VM has stopped, for whatever reason.
	Done() <-chan struct{}
	Destroy() error
}

// Egress is the run's way out of the VM for its tools (a *broker.Session):
// the same grants and policy as the code inside the VM meets.
type Egress interface {
	Fetch(ctx context.Context, req broker.Request) (*broker.Response, error)
	ConnectionRequest(ctx context.Context, name string, req broker.Request) (*broker.Response, error)
}

// Firewall counts what the VM's network firewall dropped (a
// *netns.Network).
type Firewall interface {
	Counters() (netns.Counters, error)
}

// Machine is a run's booted microVM and what came with it.
type Machine struct {
	VM VM
	// Egress is nil unless the run was granted web or connections.
	Egress Egress
	// Firewall is nil where there is none to read; a run whose VM
	// tried to reach what it may not gets a Network entry otherwise.
	Firewall Firewall
}

// BootFunc creates the microVM for one run. rec is the run's: what the
// VM's broker forwards lands on its timeline and bill.
type BootFunc func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (Machine, error)

// Models resolves a run's model name to its provider and price (a
// *registry.Registry).
type Models interface {
	Lookup(name string) (registry.Model, error)
}

// Config configures the Executor.
type Config struct {
	Boot   BootFunc
	Models Models
	// Replays serves runs that ask for a replay (runs.Spec.Replay): the
	// named recording's model, priced, with a fresh provider that replays
	// its turns. Nil: such runs fail.
	Replays func(name string) (registry.Model, error)

	// MaxTurns bounds the model calls of one run (default 20).
	MaxTurns int
	// CommandTimeout is the longest one shell command may run (default
	// 60 s); the model may ask for less.
	CommandTimeout time.Duration
	// OutputBytes is how much of each of a command's stdout and stderr
	// the model sees, head and tail kept (default 16 KiB).
	OutputBytes int
	// MaxAnswerTokens bounds max_tokens when the budget allows more
	// (default 4096).
	MaxAnswerTokens int
	// MaxOutputFileBytes and MaxOutputBytes cap each output file a run
	// keeps and all of them together (default 10 MiB and 50 MiB).
	MaxOutputFileBytes int64
	MaxOutputBytes     int64
	// Rates are what the runs service charges (the compute price is part
	// of MinimumBudget); the zero value: ledger.DefaultRates.
	Rates ledger.Rates
}

// Executor drives runs. It is safe for concurrent use: each Execute has its
// own VM and conversation.
type Executor struct {
	cfg Config
}

// Defaults of Config.
const (
	DefaultMaxTurns        = 20
	DefaultCommandTimeout  = 60 * time.Second
	DefaultOutputBytes     = 16 << 10
	DefaultMaxAnswerTokens = 4096
)

// New checks cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	if cfg.Boot == nil || cfg.Models == nil {
		return nil, errors.New("agent: Config needs Boot and Models")
	}
	if cfg.MaxTurns <= 0 {
		cfg.MaxTurns = DefaultMaxTurns
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = DefaultCommandTimeout
	}
	if cfg.OutputBytes <= 0 {
		cfg.OutputBytes = DefaultOutputBytes
	}
	if cfg.MaxAnswerTokens <= 0 {
		cfg.MaxAnswerTokens = DefaultMaxAnswerTokens
	}
	if cfg.MaxOutputFileBytes <= 0 {
		cfg.MaxOutputFileBytes = DefaultMaxOutputFileBytes
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.Rates == (ledger.Rates{}) {
		cfg.Rates = ledger.DefaultRates
	}
	return &Executor{cfg: cfg}, nil
}

// Execute runs spec to its end: boot, files, the model loop, the output
// files, destroy.
func (e *Executor) Execute(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (_ runs.Result, err error) {
	m, err := e.model(spec)
	if err != nil {
		return runs.Result{}, fmt.Errorf("agent: %w", err)
	}
	provider := m.Provider
	// Under zero data retention the exchanges are not even encoded.
	if !spec.ZeroDataRetention {
		provider = recording.Wrap(provider, rec.Recording())
		defer func() { err = errors.Join(err, rec.Recording().Err()) }()
	}

	bootStart := time.Now()
	machine, err := e.cfg.Boot(ctx, spec, rec)
	if err != nil {
		return runs.Result{}, fmt.Errorf("agent: boot microVM: %w", err)
	}
	vm := machine.VM
	ready := time.Now()
	rec.BootDuration(ready.Sub(bootStart))
	// The run's timeout and its compute both start now: the boot is the
	// platform's, not the run's.
	ctx, stopClock := rec.StartClock(ctx)
	defer stopClock()
	compute := startComputeMeter(rec, ready)
	defer func() {
		// However the run ended, what it wrote is copied out first.
		err = errors.Join(err, e.collectOutputs(ctx, vm, spec, rec))
		// The counters go with the VM's network: read them before it goes.
		err = errors.Join(err, reportBlockedEgress(rec, machine.Firewall))
		destroyErr := vm.Destroy()
		vmTime := compute.stop()
		if destroyErr != nil {
			// Never claim a teardown that did not happen; the sandbox
			// manager's reconciliation removes what is left.
			err = errors.Join(err, fmt.Errorf("agent: destroy microVM: %w", destroyErr))
			return
		}
		err = errors.Join(err, rec.Event(timeline.MicroVM, timeline.MicroVMDestroyed, map[string]any{"vm_ms": vmTime.Milliseconds()}))
	}()
	if err := rec.Event(timeline.MicroVM, timeline.MicroVMReady, map[string]any{"boot_ms": ready.Sub(bootStart).Milliseconds()}); err != nil {
		return runs.Result{}, err
	}
	if spec.NeedsEgress() && machine.Egress == nil {
		// Fail closed: tools offered without a broker behind them would
		// fail every call, and the VM would have no way out either.
		return runs.Result{}, errors.New("agent: the run is granted web or connections, but its microVM came without a broker")
	}
	if err := writeFiles(ctx, vm, spec.Files); err != nil {
		return runs.Result{}, err
	}
	names := connectionNames(spec)
	if err := rec.Event(timeline.MicroVM, timeline.WorkerStarted(spec.Shell, spec.Web, names...), map[string]any{
		"user": "worker", "shell": spec.Shell, "web": spec.Web, "connections": names, "files": len(spec.Files),
	}); err != nil {
		return runs.Result{}, err
	}
	if spec.Replay != "" {
		if err := rec.Event(timeline.Model, "replay: model answers come from a recording, commands run live in this microVM",
			map[string]any{"replay": true}); err != nil {
			return runs.Result{}, err
		}
	}

	loop := &conversation{cfg: &e.cfg, spec: spec, rec: rec, vm: vm, egress: machine.Egress, model: m, provider: provider}
	answer, err := loop.run(ctx)
	if err != nil {
		return runs.Result{}, err
	}
	return runs.Result{Output: answer}, nil
}

// model resolves the run's model: its recording's replay for a replay
// run, else the registry's provider.
func (e *Executor) model(spec runs.Spec) (registry.Model, error) {
	if spec.Replay == "" {
		return e.cfg.Models.Lookup(spec.Model)
	}
	if e.cfg.Replays == nil {
		return registry.Model{}, fmt.Errorf("replay %q: this daemon replays no recordings", spec.Replay)
	}
	m, err := e.cfg.Replays(spec.Replay)
	if err != nil {
		return registry.Model{}, fmt.Errorf("replay %q: %w", spec.Replay, err)
	}
	if m.Name != spec.Model {
		return registry.Model{}, fmt.Errorf("replay %q: recorded with model %q, the run asks for %q", spec.Replay, m.Name, spec.Model)
	}
	return m, nil
}

// reportBlockedEgress puts what the VM's firewall dropped on the timeline,
// so attempts to reach what the run may not are visible. A run with no
// drops gets no entry. Counters that cannot be read cost the entry, not
// the run.
func reportBlockedEgress(rec *runs.Recorder, fw Firewall) error {
	if fw == nil {
		return nil
	}
	c, err := fw.Counters()
	if err != nil || c.Total().Packets == 0 {
		return nil
	}
	return rec.Event(timeline.Network, timeline.EgressBlocked(c.DNS.Packets, c.IPv6.Packets, c.Other.Packets), map[string]any{
		"packets": c.Total().Packets, "bytes": c.Total().Bytes,
		"dns_packets": c.DNS.Packets, "ipv6_packets": c.IPv6.Packets, "other_packets": c.Other.Packets,
	})
}

func connectionNames(spec runs.Spec) []string {
	names := make([]string, len(spec.Connections))
	for i, c := range spec.Connections {
		names[i] = c.Name
	}
	return names
}

// writeFiles puts the run's inline files into the scratch directory, owned
// by the worker, before the worker starts. Paths were checked by the API to
// be clean and relative; they are checked again because a path that
// escapes the scratch dir would be written by the root init.
func writeFiles(ctx context.Context, vm VM, files []runs.File) error {
	for _, f := range files {
		if err := checkScratchPath(f.Path); err != nil {
			return fmt.Errorf("agent: file %q: %w", f.Path, err)
		}
		if dir := parentDir(f.Path); dir != "" {
			stderr := vsockproto.NewCappedBuffer(4096)
			st, err := vm.Exec(ctx, vsockproto.ExecRequest{Argv: []string{"mkdir", "-p", "--", dir}, Timeout: 30 * time.Second}, nil, nil, stderr)
			if err != nil {
				return fmt.Errorf("agent: create directory for %q: %w", f.Path, err)
			}
			if st.Code != 0 {
				return fmt.Errorf("agent: create directory for %q: mkdir exited %d: %s", f.Path, st.Code, stderr.Bytes())
			}
		}
		if err := vm.WriteFile(ctx, vsockproto.FileRequest{Path: f.Path, Mode: f.Mode}, strings.NewReader(f.Content)); err != nil {
			return fmt.Errorf("agent: write file %q: %w", f.Path, err)
		}
	}
	return nil
}
