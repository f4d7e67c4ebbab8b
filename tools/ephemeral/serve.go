package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/daemon"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

var serveCommand = &cli.Command{
	Name:  "serve",
	Usage: "serve the runs API (POST /v1/runs) on a local address",
	Description: "Settings come from flags, then EPHEMERAL_* environment variables, then the JSON " +
		"config file (keys are the flag names), then the defaults.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "optional JSON config file whose keys are flag names", EnvVars: []string{"EPHEMERAL_CONFIG"}},
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "address to serve on", EnvVars: []string{"EPHEMERAL_LISTEN"}},
		&cli.DurationFlag{Name: "retention", Value: 30 * 24 * time.Hour, Usage: "how long run content is kept", EnvVars: []string{"EPHEMERAL_RETENTION"}},
		&cli.DurationFlag{Name: "janitor-interval", Value: time.Hour, Usage: "how often expired content is purged", EnvVars: []string{"EPHEMERAL_JANITOR_INTERVAL"}},
		&cli.IntFlag{Name: "max-concurrent-runs", Value: runs.DefaultMaxConcurrent(), Usage: "runs executing at once (default: one per CPU)", EnvVars: []string{"EPHEMERAL_MAX_CONCURRENT_RUNS"}},
		&cli.IntFlag{Name: "max-active-runs-per-org", Value: 10, Usage: "queued plus running runs per organisation before 429", EnvVars: []string{"EPHEMERAL_MAX_ACTIVE_RUNS_PER_ORG"}},
		&cli.Int64Flag{Name: "max-cost-micros", Value: 100_000_000, Usage: "largest max_cost_micros one run may ask for", EnvVars: []string{"EPHEMERAL_MAX_COST_MICROS"}},
		&cli.StringFlag{Name: "default-model", Value: "openai/gpt-6-luna", Usage: "model used when a request names none", EnvVars: []string{"EPHEMERAL_DEFAULT_MODEL"}},
		&cli.Int64Flag{Name: "compute-micros-per-vm-second", Value: ledger.DefaultRates.ComputeMicrosPerVMSecond, Usage: "compute price", EnvVars: []string{"EPHEMERAL_COMPUTE_MICROS_PER_VM_SECOND"}},
		&cli.Int64Flag{Name: "web-micros-per-request", Value: ledger.DefaultRates.WebMicrosPerRequest, Usage: "price of one brokered web request", EnvVars: []string{"EPHEMERAL_WEB_MICROS_PER_REQUEST"}},
		&cli.DurationFlag{Name: "shutdown-timeout", Value: 30 * time.Second, Usage: "how long a graceful shutdown waits for requests", EnvVars: []string{"EPHEMERAL_SHUTDOWN_TIMEOUT"}},
	},
	Action: serve,
}

func serve(c *cli.Context) error {
	if err := applyConfigFile(c); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	stateDir := c.String(stateDirFlag.Name)
	conns, closeConns, err := openConnections(ctx, stateDir)
	if err != nil {
		return err
	}
	defer closeConns()
	rt, err := newRunner(stateDir, runnerOptions{connections: conns})
	if err != nil {
		return err
	}
	defer rt.manager.Shutdown()
	return daemon.Run(ctx, daemon.Config{
		Listen:          c.String("listen"),
		StateDir:        stateDir,
		Retention:       c.Duration("retention"),
		JanitorInterval: c.Duration("janitor-interval"),
		MaxConcurrent:   c.Int("max-concurrent-runs"),
		MaxActivePerOrg: c.Int("max-active-runs-per-org"),
		MaxCostMicros:   c.Int64("max-cost-micros"),
		DefaultModel:    c.String("default-model"),
		Rates: ledger.Rates{
			ComputeMicrosPerVMSecond: c.Int64("compute-micros-per-vm-second"),
			WebMicrosPerRequest:      c.Int64("web-micros-per-request"),
		},
		ShutdownTimeout: c.Duration("shutdown-timeout"),
		Executor:        rt.executor,
		Reconcile:       rt.reconcile,
		ValidateModel:   rt.validateModel,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
}

// openConnections gives the broker the organisations' connections, opened
// with the state directory's key. It reads them through a handle of its
// own on the daemon's database, which WAL lets it share with the daemon
// (as the admin commands do).
func openConnections(ctx context.Context, stateDir string) (*connections.Registry, func(), error) {
	key, err := seal.LoadKey(stateDir)
	if err != nil {
		return nil, nil, err
	}
	st, err := store.Open(ctx, daemon.DBPath(stateDir))
	if err != nil {
		return nil, nil, err
	}
	return connections.NewRegistry(st, key), func() { st.Close() }, nil
}

// applyConfigFile fills every flag that neither the command line nor the
// environment set from the JSON file named by --config.
func applyConfigFile(c *cli.Context) error {
	path := c.String("config")
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("serve: read config: %w", err)
	}
	var values map[string]any
	if err := json.Unmarshal(b, &values); err != nil {
		return fmt.Errorf("serve: parse config %s: %w", path, err)
	}
	known := map[string]bool{}
	for _, f := range c.Command.Flags {
		known[f.Names()[0]] = true
	}
	for name, v := range values {
		if !known[name] || name == "config" {
			return fmt.Errorf("serve: config %s: unknown setting %q", path, name)
		}
		if c.IsSet(name) {
			continue
		}
		if err := c.Set(name, fmt.Sprint(v)); err != nil {
			return fmt.Errorf("serve: config %s: %s: %w", path, name, err)
		}
	}
	return nil
}
