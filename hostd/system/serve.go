package system

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

	"github.com/ephemeralhq/ephemeral/internal/flock"
)

// Start settles the runs a previous daemon left active (and removes their
// sandboxes and any other leftovers of dead processes), then starts the
// sandbox pool filling and the runs service: its scheduler and retention
// janitor run until Close.
func (s *System) Start(ctx context.Context) error {
	recovered, err := s.Runs.Recover(ctx)
	if len(recovered) > 0 {
		s.Log.Warn("ended runs left active by a previous daemon", "runs", recovered)
	}
	if err != nil {
		return err
	}
	if s.Pool != nil {
		s.Pool.Start()
	}
	runsCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.runsCancel, s.runsDone = cancel, make(chan struct{})
	go func() {
		defer close(s.runsDone)
		s.Runs.Serve(runsCtx, s.Config.JanitorInterval)
	}()
	return nil
}

// Serve serves the API on the configured address until ctx ends, then
// stops accepting requests, ends live event streams and waits (up to the
// shutdown timeout) for requests in flight. Start must have been called;
// Close stops the runs afterwards.
func (s *System) Serve(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.Config.Listen)
	if err != nil {
		return fmt.Errorf("system: listen on %s: %w", s.Config.Listen, err)
	}
	srv := &http.Server{
		Handler:           s.API.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.Log.Handler(), slog.LevelWarn),
	}
	srv.RegisterOnShutdown(s.API.CloseStreams)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	s.Log.Info("serving the Ephemeral API", "addr", ln.Addr().String(), "state_dir", s.Config.StateDir)

	var result error
	select {
	case <-ctx.Done():
		s.Log.Info("shutting down")
	case err := <-serveErr:
		result = fmt.Errorf("system: serve: %w", err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		result = errors.Join(result, fmt.Errorf("system: shutdown: %w", err))
	}
	return result
}

// lockStateDir makes sure only one daemon serves a state directory: a
// second one would "recover" the first one's live runs. The kernel drops
// the lock when the process dies, so a SIGKILLed daemon never blocks its
// successor.
func lockStateDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("system: create state dir: %w", err)
	}
	f, err := flock.TryLock(filepath.Join(dir, "daemon.lock"), flock.Exclusive)
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("system: another daemon is serving %s", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("system: %w", err)
	}
	return func() { f.Close() }, nil
}
