// Command blockingserve is `ephemeral serve` with a test Executor whose runs
// meter some usage and then block forever, so a test can SIGKILL the daemon
// mid-run. It lives under testdata so no product build can select it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

type blockingExecutor struct{}

func (blockingExecutor) Execute(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
	if err := rec.Event(timeline.MicroVM, timeline.MicroVMReady, nil); err != nil {
		return runs.Result{}, err
	}
	// A command that is running when the daemon is killed.
	if _, err := rec.StartContentEvent(time.Now(), timeline.Shell, timeline.Command("sleep infinity"),
		map[string]any{"command": "sleep infinity", "state": timeline.Running}); err != nil {
		return runs.Result{}, err
	}
	if err := rec.Charge(ledger.Usage{ModelCalls: 1, InputTokens: 900, ModelMicros: 500, VMTime: 5 * time.Second}); err != nil {
		return runs.Result{}, err
	}
	<-ctx.Done()
	return runs.Result{}, ctx.Err()
}

func main() {
	stateDir := flag.String("state-dir", "", "state directory")
	reconciled := flag.String("reconciled", "", "file to write reconciled run ids to")
	flag.Parse()
	if err := serve(*stateDir, *reconciled); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serve(stateDir, reconciled string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := config.Defaults()
	cfg.StateDir, cfg.Listen = stateDir, "127.0.0.1:0"
	// The default model must be usable for runs to be accepted; the
	// blocking executor never calls it.
	cfg.OpenAIBaseURL, cfg.DefaultModel = "http://127.0.0.1:9/v1", "openai/gpt-6-luna"
	sys, err := system.New(ctx, cfg, system.Options{
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Executor: blockingExecutor{},
		Reconcile: func(ctx context.Context, ids []string) error {
			if len(ids) == 0 {
				return nil // every start-up reconciles; the test wants the recovered ids
			}
			return os.WriteFile(reconciled, []byte(strings.Join(ids, "\n")), 0o600)
		},
	})
	if err != nil {
		return err
	}
	defer sys.Close()
	if err := sys.Start(ctx); err != nil {
		return err
	}
	return sys.Serve(ctx)
}
