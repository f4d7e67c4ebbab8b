package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
)

var runCommand = &cli.Command{
	Name:  "run",
	Usage: "run the agent once in a fresh microVM and print its timeline, output and cost",
	Description: "With --replay, the model's turns come from a recording (no API key needed) while " +
		"the commands really run in the microVM: `ephemeral run --replay examples/product-page.json`. " +
		"With --prompt, a live model answers (configure its provider as for serve). The run uses the " +
		"daemon's runs service and ledger in-process, on a throwaway database: no account is charged. " +
		"Prices, providers and the VMM come from the configuration (see ephemeral serve --help). " + exitCodesHelp,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "replay", Usage: "recording whose model turns to replay"},
		&cli.StringFlag{Name: "prompt", Usage: "task for a live model"},
		&cli.StringFlag{Name: "model", Usage: "live model (ignored with --replay)", DefaultText: "the default-model setting"},
		&cli.BoolFlag{Name: "shell", Value: true, Usage: "grant the shell (ignored with --replay)"},
		&cli.BoolFlag{Name: "web", Usage: "grant web access through the broker (ignored with --replay)"},
		&cli.DurationFlag{Name: "timeout", Value: 120 * time.Second, Usage: "hard timeout of the run"},
		&cli.Int64Flag{Name: "max-cost-micros", Value: 40_000, Usage: "budget of the run (40000 = $0.04)"},
	},
	Action: runOnce,
}

func runOnce(c *cli.Context) error {
	if err := requireRoot(c, vmsNeedRoot); err != nil {
		return err
	}
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
		spec.Replay = path
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
	if spec.Replay == "" {
		if spec.Model, err = liveModel(spec.Model, loaded.Config.DefaultModel, sys.Models); err != nil {
			return err
		}
	}
	if err := sys.Start(ctx); err != nil {
		return err
	}
	run, err := runInProcess(ctx, sys, spec, c.String("replay"), c.App.Writer)
	if err != nil {
		return err
	}
	return runOutcome(string(run.Status), run.ErrorMessage)
}

// liveModel is the model a live run uses: the one named, else the
// configured default; refused before anything boots when none is named or
// its provider is not configured.
func liveModel(named, configured string, models *registry.Registry) (string, error) {
	name := cmp.Or(named, configured)
	if name == "" {
		return "", fmt.Errorf("run: give --model NAME (no default-model is configured); usable models: %s", usableList(models))
	}
	if _, err := models.Lookup(name); err != nil {
		return "", fmt.Errorf("run: %w; usable models: %s", err, usableList(models))
	}
	return name, nil
}

func usableList(models *registry.Registry) string {
	if names := models.Names(); len(names) > 0 {
		return strings.Join(names, ", ")
	}
	return "none (configure a model provider: see ephemeral serve --help)"
}

// loadReplay loads a recording, or an example document's (see package
// example), and takes the run's prompt, model and permissions from its
// first request, so the replay asks what was asked. Connections are not
// replayed: the throwaway organisation has none.
func loadReplay(path string, spec *runs.Spec) (*recording.Replay, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	if example.IsExample(data) {
		ex, err := example.Parse(data)
		if err != nil {
			return nil, fmt.Errorf("run: %s: %w", path, err)
		}
		data = ex.Recording
	}
	rec, err := recording.Decode(bytes.NewReader(data))
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
		run, err = sys.Runs.Follow(ctx, org.ID, run.ID, printer.rev, storeFollower{printer})
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
	label := "Output"
	if replayOf != "" {
		// The answer is the recorded one; the live results are under the
		// commands above.
		label = "Recorded output"
	}
	printOutcome(out, label, run.Output, run.Cost.Model, run.Cost.Web, run.Cost.Compute)
	return run, nil
}

// storeFollower hands the printer what runs.Follow reads.
type storeFollower struct{ p *timelinePrinter }

func (f storeFollower) Events(batch []store.Event) error {
	for _, ev := range batch {
		f.p.stream(entryFromStore(ev))
	}
	return nil
}

// Idle has nothing to keep alive on a terminal.
func (storeFollower) Idle() error { return nil }
