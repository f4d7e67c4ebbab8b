package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

var runCommand = &cli.Command{
	Name:  "run",
	Usage: "run the agent once in a fresh microVM and print its timeline, output and cost",
	Description: "With --replay, the model's turns come from a recording (no API key needed) while " +
		"the commands really run in the microVM: `ephemeral run --replay examples/product-page.json`. " +
		"With --prompt, a live model answers (configure its provider as for serve). The run uses the " +
		"daemon's runs service and ledger in-process, on a throwaway database: no account is charged.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "replay", Usage: "recording whose model turns to replay"},
		&cli.StringFlag{Name: "prompt", Usage: "task for a live model"},
		&cli.StringFlag{Name: "model", Value: "openai/gpt-6-luna", Usage: "live model (ignored with --replay)"},
		&cli.BoolFlag{Name: "shell", Value: true, Usage: "grant the shell (ignored with --replay)"},
		&cli.BoolFlag{Name: "web", Usage: "grant web access through the broker (ignored with --replay)"},
		&cli.DurationFlag{Name: "timeout", Value: 120 * time.Second, Usage: "hard timeout of the run"},
		&cli.Int64Flag{Name: "max-cost-micros", Value: 40_000, Usage: "budget of the run (40000 = $0.04)"},
		&cli.Int64Flag{Name: "compute-micros-per-vm-second", Value: ledger.DefaultRates.ComputeMicrosPerVMSecond, Usage: "compute price"},
		&cli.Int64Flag{Name: "web-micros-per-request", Value: ledger.DefaultRates.WebMicrosPerRequest, Usage: "price of one brokered web request"},
	},
	Action: runOnce,
}

func runOnce(c *cli.Context) error {
	spec := runs.Spec{
		Prompt: c.String("prompt"), Model: c.String("model"), Shell: c.Bool("shell"), Web: c.Bool("web"),
		Timeout: c.Duration("timeout"), MaxCostMicros: c.Int64("max-cost-micros"),
	}
	var opts runnerOptions
	if path := c.String("replay"); path != "" {
		var err error
		if opts, err = replayOptions(path, &spec); err != nil {
			return err
		}
	} else if spec.Prompt == "" {
		return errors.New("run: give --replay RECORDING or --prompt TEXT")
	}
	if spec.Timeout <= 0 || spec.MaxCostMicros <= 0 {
		return errors.New("run: --timeout and --max-cost-micros must be positive")
	}
	rt, err := newRunner(c.String(stateDirFlag.Name), opts)
	if err != nil {
		return err
	}
	defer rt.manager.Shutdown()

	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	rates := ledger.Rates{
		ComputeMicrosPerVMSecond: c.Int64("compute-micros-per-vm-second"),
		WebMicrosPerRequest:      c.Int64("web-micros-per-request"),
	}
	run, err := runInProcess(ctx, rt, spec, rates, c.App.Writer)
	if err != nil {
		return err
	}
	if run.Status != store.Succeeded {
		return cli.Exit(fmt.Sprintf("run %s: %s", run.Status, run.ErrorMessage), 1)
	}
	return nil
}

// replayOptions loads a recording and takes the run's prompt, model and
// permissions from its first request, so the replay asks what was asked.
// Connections are not replayed: the throwaway organisation has none.
func replayOptions(path string, spec *runs.Spec) (runnerOptions, error) {
	f, err := os.Open(path)
	if err != nil {
		return runnerOptions{}, fmt.Errorf("run: %w", err)
	}
	defer f.Close()
	exchanges, err := recording.Decode(f)
	if err != nil {
		return runnerOptions{}, fmt.Errorf("run: %s: %w", path, err)
	}
	replay, err := recording.NewReplay(exchanges)
	if err != nil {
		return runnerOptions{}, fmt.Errorf("run: %s: %w", path, err)
	}
	first := exchanges[0].Request
	if len(first.Messages) == 0 || first.Messages[0].Role != model.RoleUser {
		return runnerOptions{}, fmt.Errorf("run: %s: the first request has no user prompt", path)
	}
	spec.Prompt, spec.Model, spec.Shell, spec.Web = first.Messages[0].Text, first.Model, false, false
	for _, t := range first.Tools {
		spec.Shell = spec.Shell || t.Name == agent.ShellTool
		spec.Web = spec.Web || t.Name == agent.WebFetchTool
	}
	price, err := configuredPrice(spec.Model)
	if err != nil {
		return runnerOptions{}, err
	}
	return runnerOptions{
		providers: map[string]model.Provider{"replay": replay},
		models:    []registry.ModelConfig{{Name: spec.Model, Provider: "replay", Price: &price}},
		replayOf:  path,
	}, nil
}

// configuredPrice is what the model would be billed at live, so a replay
// costs what the original run cost.
func configuredPrice(name string) (model.Price, error) {
	cfg, err := registry.ConfigFromEnv(os.Getenv, os.ReadFile)
	if err != nil {
		return model.Price{}, err
	}
	for _, m := range append(cfg.Models, registry.DefaultModels()...) {
		if m.Name == name && m.Price != nil {
			return *m.Price, nil
		}
	}
	return model.Price{}, fmt.Errorf("run: model %q has no price (add it to %s)", name, registry.EnvModelsFile)
}

// runInProcess runs spec through a runs service of its own, on a throwaway
// database with an organisation funded for exactly this run, printing the
// timeline as it grows.
func runInProcess(ctx context.Context, rt *runner, spec runs.Spec, rates ledger.Rates, out io.Writer) (store.Run, error) {
	dir, err := os.MkdirTemp("", "ephemeral-run-db-")
	if err != nil {
		return store.Run{}, fmt.Errorf("run: %w", err)
	}
	defer os.RemoveAll(dir)
	st, err := store.Open(ctx, filepath.Join(dir, "ephemeral.db"))
	if err != nil {
		return store.Run{}, err
	}
	defer st.Close()
	org, err := st.CreateOrg(ctx, "local")
	if err != nil {
		return store.Run{}, err
	}
	if _, err := st.Credit(ctx, org.ID, spec.MaxCostMicros); err != nil {
		return store.Run{}, err
	}
	hub := timeline.NewHub()
	svc := runs.New(st, hub, runs.Config{Executor: rt.executor, Rates: rates, MaxConcurrent: 1})
	serveCtx, stopServe := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan struct{})
	go func() { defer close(served); svc.Serve(serveCtx, time.Hour) }()
	defer func() { stopServe(); <-served }()

	spec.OrgID = org.ID
	canonical, err := json.Marshal(spec)
	if err != nil {
		return store.Run{}, fmt.Errorf("run: %w", err)
	}
	run, _, err := svc.Submit(ctx, runs.Submission{Spec: spec, Canonical: canonical})
	if err != nil {
		return store.Run{}, err
	}
	mode := "live"
	if rt.replaying() {
		mode = "replayed from " + rt.replayOf
	}
	fmt.Fprintf(out, "%s  model %s, %s\n\n", run.ID, spec.Model, mode)
	printer := newTimelinePrinter(out)
	var rev int64
	for {
		changed := hub.Changed(run.ID)
		events, err := st.EventsSince(context.WithoutCancel(ctx), run.ID, rev, 100)
		if err != nil {
			return store.Run{}, err
		}
		for _, ev := range events {
			printer.print(ev)
			rev = ev.Rev
		}
		if run, err = st.GetRun(context.WithoutCancel(ctx), org.ID, run.ID); err != nil {
			return store.Run{}, err
		}
		if run.Status.Terminal() && len(events) == 0 {
			break
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			// Ctrl-C: stop the run and let it settle; its last entries
			// are printed by the next rounds.
			if _, err := svc.Cancel(context.WithoutCancel(ctx), org.ID, run.ID); err != nil {
				return store.Run{}, err
			}
			ctx = context.WithoutCancel(ctx)
		}
	}
	printer.finish()
	if run.Output != nil {
		label := "Output"
		if rt.replaying() {
			// The answer is the recorded one; the live results are
			// under the commands above.
			label = "Recorded output"
		}
		fmt.Fprintf(out, "\n%s:\n%s\n", label, *run.Output)
	}
	fmt.Fprintf(out, "\nmodel %s · web %s · compute %s\n", money.Format(run.Cost.Model), money.Format(run.Cost.Web), money.Format(run.Cost.Compute))
	return run, nil
}

func (rt *runner) replaying() bool { return rt.replayOf != "" }

// timelinePrinter writes timeline entries as they arrive, as the product
// page shows them. A command's entry arrives when the command starts and
// again, amended, when it ends. Results are printed in timeline order, so
// parallel commands read the same however they finish: a result waits for
// those of the earlier commands still running. A result goes right below
// its command's line when nothing was printed in between, else below a
// line repeating the command with its exit code and duration.
type timelinePrinter struct {
	out     io.Writer
	printed map[int64]bool        // entries whose line is out
	last    int64                 // the entry printed last
	pending []int64               // commands whose result is not out, in timeline order
	ended   map[int64]store.Event // results waiting for earlier commands'
}

func newTimelinePrinter(out io.Writer) *timelinePrinter {
	return &timelinePrinter{out: out, printed: map[int64]bool{}, ended: map[int64]store.Event{}}
}

// commandData is what the printer reads of a shell entry's data.
type commandData struct {
	State      timeline.State `json:"state"`
	Stdout     string         `json:"stdout"`
	Stderr     string         `json:"stderr"`
	ExitCode   int            `json:"exit_code"`
	DurationMS int64          `json:"duration_ms"`
}

func (p *timelinePrinter) print(ev store.Event) {
	var data commandData
	if ev.Category != timeline.Shell || json.Unmarshal(ev.Data, &data) != nil {
		p.line(ev.T, ev.Category, clipLine(ev.Message, 100))
		p.last = ev.Seq
		return
	}
	if !slices.Contains(p.pending, ev.Seq) {
		i, _ := slices.BinarySearch(p.pending, ev.Seq)
		p.pending = slices.Insert(p.pending, i, ev.Seq)
	}
	if data.State == timeline.Running {
		p.line(ev.T, ev.Category, clipLine(ev.Message, 100))
		p.printed[ev.Seq], p.last = true, ev.Seq
		return
	}
	p.ended[ev.Seq] = ev
	for len(p.pending) > 0 {
		first, ok := p.ended[p.pending[0]]
		if !ok {
			return
		}
		p.result(first)
		delete(p.ended, first.Seq)
		p.pending = p.pending[1:]
	}
}

// finish prints the results still waiting, for when an earlier command's
// result will never come (its entry could not be amended).
func (p *timelinePrinter) finish() {
	for _, seq := range p.pending {
		if ev, ok := p.ended[seq]; ok {
			p.result(ev)
		}
	}
	p.pending, p.ended = nil, map[int64]store.Event{}
}

// result prints a finished command's output.
func (p *timelinePrinter) result(ev store.Event) {
	var data commandData
	json.Unmarshal(ev.Data, &data) // print checked it decodes
	switch {
	case !p.printed[ev.Seq]:
		p.line(ev.T, ev.Category, clipLine(ev.Message, 100))
	case p.last != ev.Seq:
		took := time.Duration(data.DurationMS) * time.Millisecond
		p.line(ev.T, ev.Category, fmt.Sprintf("%s  → exit %d after %.2f s", clipLine(ev.Message, 100), data.ExitCode, took.Seconds()))
	}
	p.printed[ev.Seq], p.last = true, ev.Seq
	for _, line := range strings.Split(strings.TrimRight(data.Stdout+data.Stderr, "\n"), "\n") {
		if line != "" {
			fmt.Fprintf(p.out, "%25s│ %s\n", "", clipLine(line, 100))
		}
	}
}

func (p *timelinePrinter) line(t time.Duration, category, message string) {
	fmt.Fprintf(p.out, "%6.2f  %-16s %s\n", t.Seconds(), category, message)
}

func clipLine(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
