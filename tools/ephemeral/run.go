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
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

var runCommand = &cli.Command{
	Name:  "run",
	Usage: "run the agent once in a fresh microVM and print its timeline, output and cost",
	Description: "With --replay, the model's turns come from a recording (no API key needed) while " +
		"the commands really run in the microVM: `ephemeral run --replay examples/product-page.json`. " +
		"With --prompt, a live model answers (configure its provider as for serve). The run uses the " +
		"daemon's runs service and ledger in-process, on a throwaway database: no account is charged. " +
		"Prices, providers and the VMM come from the configuration (see ephemeral serve --help).",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "replay", Usage: "recording whose model turns to replay"},
		&cli.StringFlag{Name: "prompt", Usage: "task for a live model"},
		&cli.StringFlag{Name: "model", Value: "openai/gpt-6-luna", Usage: "live model (ignored with --replay)"},
		&cli.BoolFlag{Name: "shell", Value: true, Usage: "grant the shell (ignored with --replay)"},
		&cli.BoolFlag{Name: "web", Usage: "grant web access through the broker (ignored with --replay)"},
		&cli.DurationFlag{Name: "timeout", Value: 120 * time.Second, Usage: "hard timeout of the run"},
		&cli.Int64Flag{Name: "max-cost-micros", Value: 40_000, Usage: "budget of the run (40000 = $0.04)"},
	},
	Action: runOnce,
}

func runOnce(c *cli.Context) error {
	loaded, err := loadConfig(c)
	if err != nil {
		return err
	}
	spec := runs.Spec{
		Prompt: c.String("prompt"), Model: c.String("model"), Shell: c.Bool("shell"), Web: c.Bool("web"),
		Timeout: c.Duration("timeout"), MaxCostMicros: c.Int64("max-cost-micros"),
	}
	var replay *recording.Replay
	if path := c.String("replay"); path != "" {
		if replay, err = loadReplay(path, &spec); err != nil {
			return err
		}
		if cut, ok := replay.Truncated(); ok {
			fmt.Fprintf(c.App.ErrWriter, "note: %s was cut at its size cap of %d bytes after turn %d (%d later turns not stored): the replay fails at turn %d\n",
				path, cut.LimitBytes, cut.KeptTurns, cut.DroppedTurns, cut.KeptTurns+1)
		}
	} else if spec.Prompt == "" {
		return errors.New("run: give --replay RECORDING or --prompt TEXT")
	}
	if spec.Timeout <= 0 || spec.MaxCostMicros <= 0 {
		return errors.New("run: --timeout and --max-cost-micros must be positive")
	}

	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "ephemeral-run-db-")
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	defer os.RemoveAll(dir)
	sys, err := system.New(ctx, loaded.Config, system.Options{
		Logger:    stderrLog,
		SingleRun: true,
		Database:  filepath.Join(dir, "ephemeral.db"),
		Replay:    replay,
		ReplayOf:  c.String("replay"),
	})
	if err != nil {
		return err
	}
	defer sys.Close()
	if err := sys.Start(ctx); err != nil {
		return err
	}
	run, err := runInProcess(ctx, sys, spec, c.String("replay"), c.App.Writer)
	if err != nil {
		return err
	}
	if run.Status != store.Succeeded {
		return cli.Exit(fmt.Sprintf("run %s: %s", run.Status, run.ErrorMessage), 1)
	}
	return nil
}

// loadReplay loads a recording and takes the run's prompt, model and
// permissions from its first request, so the replay asks what was asked.
// Connections are not replayed: the throwaway organisation has none.
func loadReplay(path string, spec *runs.Spec) (*recording.Replay, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	defer f.Close()
	rec, err := recording.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("run: %s: %w", path, err)
	}
	replay, err := recording.NewReplay(rec)
	if err != nil {
		return nil, fmt.Errorf("run: %s: %w", path, err)
	}
	first := rec.Exchanges[0].Request
	if len(first.Messages) == 0 || first.Messages[0].Role != model.RoleUser {
		return nil, fmt.Errorf("run: %s: the first request has no user prompt", path)
	}
	spec.Prompt, spec.Model, spec.Shell, spec.Web = first.Messages[0].Text, first.Model, false, false
	for _, t := range first.Tools {
		spec.Shell = spec.Shell || t.Name == agent.ShellTool
		spec.Web = spec.Web || t.Name == agent.WebFetchTool
	}
	return replay, nil
}

// runInProcess runs spec on sys, in an organisation of its throwaway
// database funded for exactly this run, printing the timeline as it grows.
func runInProcess(ctx context.Context, sys *system.System, spec runs.Spec, replayOf string, out io.Writer) (store.Run, error) {
	org, err := sys.Store.CreateOrg(ctx, "local")
	if err != nil {
		return store.Run{}, err
	}
	if _, err := sys.Store.Credit(ctx, org.ID, spec.MaxCostMicros); err != nil {
		return store.Run{}, err
	}
	spec.OrgID = org.ID
	canonical, err := json.Marshal(spec)
	if err != nil {
		return store.Run{}, fmt.Errorf("run: %w", err)
	}
	run, _, err := sys.Runs.Submit(ctx, runs.Submission{Spec: spec, Canonical: canonical})
	if err != nil {
		return store.Run{}, err
	}
	mode := "live"
	if replayOf != "" {
		mode = "replayed from " + replayOf
	}
	fmt.Fprintf(out, "%s  model %s, %s\n\n", run.ID, spec.Model, mode)
	printer := newTimelinePrinter(out)
	for {
		run, err = sys.Runs.Follow(ctx, org.ID, run.ID, printer.rev, printer)
		if err == nil || ctx.Err() == nil {
			break
		}
		// Ctrl-C: stop the run and follow it to its end, so its money is
		// settled and its last entries printed.
		if _, err := sys.Runs.Cancel(context.WithoutCancel(ctx), org.ID, run.ID); err != nil {
			return store.Run{}, err
		}
		ctx = context.WithoutCancel(ctx)
	}
	if err != nil {
		return store.Run{}, err
	}
	printer.finish()
	if run.Output != nil {
		label := "Output"
		if replayOf != "" {
			// The answer is the recorded one; the live results are
			// under the commands above.
			label = "Recorded output"
		}
		fmt.Fprintf(out, "\n%s:\n%s\n", label, *run.Output)
	}
	fmt.Fprintf(out, "\nmodel %s · web %s · compute %s\n", money.Format(run.Cost.Model), money.Format(run.Cost.Web), money.Format(run.Cost.Compute))
	return run, nil
}

// timelinePrinter writes timeline entries as they arrive, as the product
// page shows them. A command's entry arrives when the command starts and
// again, amended, when it ends. Results are printed in timeline order, so
// parallel commands read the same however they finish: a result waits for
// those of the earlier commands still running. A result goes right below
// its command's line when nothing was printed in between, else below a
// line repeating the command with its exit code and duration.
type timelinePrinter struct {
	out     io.Writer
	rev     int64                 // the revision printed last
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

// Events prints a batch as runs.Follow hands it over.
func (p *timelinePrinter) Events(batch []store.Event) error {
	for _, ev := range batch {
		p.print(ev)
		p.rev = ev.Rev
	}
	return nil
}

// Idle has nothing to keep alive on a terminal.
func (p *timelinePrinter) Idle() error { return nil }

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
