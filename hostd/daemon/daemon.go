// Package daemon assembles Ephemeral's host daemon: it opens the database in
// the state directory, settles runs a previous daemon left behind, serves
// the API and, on shutdown, stops accepting requests, ends live streams,
// stops the active runs (settling their money) and closes the database.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/hostd/api"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// Config is everything `ephemeral serve` can set.
type Config struct {
	Listen          string // host:port
	StateDir        string
	Retention       time.Duration
	JanitorInterval time.Duration
	MaxConcurrent   int
	MaxActivePerOrg int
	MaxCostMicros   int64
	DefaultModel    string
	Rates           ledger.Rates
	ShutdownTimeout time.Duration

	Executor      runs.Executor // nil until the agent is wired in: runs then fail clearly
	Reconcile     func(ctx context.Context, runIDs []string) error
	ValidateModel func(model string) error
	Logger        *slog.Logger
}

// DBPath is where the daemon keeps its database inside the state directory.
func DBPath(stateDir string) string { return filepath.Join(stateDir, "ephemeral.db") }

// Run serves until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.JanitorInterval <= 0 {
		cfg.JanitorInterval = time.Hour
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := store.Open(ctx, DBPath(cfg.StateDir))
	if err != nil {
		return err
	}
	defer st.Close()
	hub := timeline.NewHub()
	svc := runs.New(st, hub, runs.Config{
		Executor: cfg.Executor, Rates: cfg.Rates, MaxConcurrent: cfg.MaxConcurrent,
		MaxActivePerOrg: cfg.MaxActivePerOrg, Retention: cfg.Retention, Reconcile: cfg.Reconcile, Logger: log,
	})
	recovered, err := svc.Recover(ctx)
	if len(recovered) > 0 {
		log.Warn("ended runs left active by a previous daemon", "runs", recovered)
	}
	if err != nil {
		return err
	}
	if cfg.Executor == nil {
		log.Warn(runs.ErrAgentNotWired.Error())
	}
	apiServer := api.New(st, svc, hub, api.Config{
		DefaultModel: cfg.DefaultModel, MaxCostMicros: cfg.MaxCostMicros, ValidateModel: cfg.ValidateModel, Logger: log,
	})
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("daemon: listen on %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{
		Handler:           apiServer.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	srv.RegisterOnShutdown(apiServer.CloseStreams)

	runsCtx, stopRuns := context.WithCancel(context.WithoutCancel(ctx))
	runsDone := make(chan struct{})
	go func() {
		defer close(runsDone)
		svc.Serve(runsCtx, cfg.JanitorInterval)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("serving the Ephemeral API", "addr", ln.Addr().String(), "state_dir", cfg.StateDir)

	var result error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveErr:
		result = fmt.Errorf("daemon: serve: %w", err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		result = errors.Join(result, fmt.Errorf("daemon: shutdown: %w", err))
	}
	stopRuns()
	<-runsDone
	return result
}

// lockStateDir makes sure only one daemon serves a state directory: a
// second one would "recover" the first one's live runs. The kernel drops
// the lock when the process dies, so a SIGKILLed daemon never blocks its
// successor.
func lockStateDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("daemon: create state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "daemon.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("daemon: open lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("daemon: another daemon is serving %s", dir)
		}
		return nil, fmt.Errorf("daemon: lock %s: %w", dir, os.NewSyscallError("flock", err))
	}
	return func() { f.Close() }, nil
}
