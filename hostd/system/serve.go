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
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/web"
	"github.com/ephemeralhq/ephemeral/internal/flock"
)

// Start settles the runs a previous daemon left active (and removes their
// sandboxes and any other leftovers of dead processes), then starts the
// sandbox pool filling, the runs service (its scheduler and retention
// janitor) and the webhook deliverer, which run until Close.
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
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stopBackground = cancel
	s.background.Add(2)
	go func() {
		defer s.background.Done()
		s.Runs.Serve(bg, s.Config.JanitorInterval)
	}()
	go func() {
		defer s.background.Done()
		s.Webhooks.Run(bg)
	}()
	return nil
}

// Serve serves the API and the web app on the configured address, and /metrics on the
// metrics address when one is configured, until ctx ends; then it stops
// accepting requests, ends live event streams and waits (up to the
// shutdown timeout) for requests in flight. Start must have been called;
// Close stops the runs afterwards.
func (s *System) Serve(ctx context.Context) error {
	apiLn, err := net.Listen("tcp", s.Config.Listen)
	if err != nil {
		return fmt.Errorf("system: listen on %s: %w", s.Config.Listen, err)
	}
	var metricsLn net.Listener
	if s.Config.MetricsListen != "" {
		if metricsLn, err = net.Listen("tcp", s.Config.MetricsListen); err != nil {
			apiLn.Close()
			return fmt.Errorf("system: listen for metrics on %s: %w", s.Config.MetricsListen, err)
		}
	}
	return s.serve(ctx, apiLn, metricsLn)
}

// serve is Serve on listeners already open; metricsLn may be nil.
func (s *System) serve(ctx context.Context, apiLn, metricsLn net.Listener) error {
	errorLog := slog.NewLogLogger(s.Log.Handler(), slog.LevelWarn)
	apiSrv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          errorLog,
	}
	apiSrv.RegisterOnShutdown(s.API.CloseStreams)
	servers := map[*http.Server]net.Listener{apiSrv: apiLn}
	s.Log.Info("serving the Ephemeral API and web app", "addr", apiLn.Addr().String(), "state_dir", s.Config.StateDir)
	if s.Config.Database != "" {
		s.Log.Info("a node of a cluster sharing PostgreSQL", "database", store.RedactURL(s.Config.Database),
			"capacity", s.Config.MaxConcurrentRuns, "node_lease", s.Config.NodeLease)
	}
	if metricsLn != nil {
		servers[&http.Server{
			Handler:           s.API.MetricsHandler(),
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			ErrorLog:          errorLog,
		}] = metricsLn
		s.Log.Info("serving metrics", "addr", metricsLn.Addr().String())
		if tcp, ok := metricsLn.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
			s.Log.Warn("metrics are served beyond loopback: they sum up every organisation's runs and money", "addr", tcp.String())
		}
	}

	if s.Announce != nil {
		fmt.Fprintf(s.Announce, "Ephemeral is serving on %s — open it in a browser (Ctrl-C stops it)\n", BaseURL(apiLn.Addr()))
	}

	failed := make(chan error, len(servers))
	var wg sync.WaitGroup
	for srv, ln := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				failed <- err
			}
		}()
	}
	var result error
	select {
	case <-ctx.Done():
		s.Log.Info("shutting down")
	case err := <-failed:
		result = fmt.Errorf("system: serve: %w", err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Config.ShutdownTimeout)
	defer cancel()
	for srv := range servers {
		if err := srv.Shutdown(shutdownCtx); err != nil {
			result = errors.Join(result, fmt.Errorf("system: shutdown: %w", err))
		}
	}
	wg.Wait()
	return result
}

// Handler is everything the daemon serves on its one origin: the API
// (/v1, /healthz, /openapi.json) and the web app (the rest), every
// response with the security headers.
func (s *System) Handler() http.Handler {
	mux := http.NewServeMux()
	api := s.API.Handler()
	for _, p := range []string{"/v1/", "/healthz", "/openapi.json"} {
		mux.Handle(p, api)
	}
	mux.Handle("/", s.Web.Handler())
	return s.proxies.Handler(web.SecurityHeaders(mux))
}

// BaseURL is the address a browser on this machine opens for a listener:
// a wildcard address becomes loopback.
func BaseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/"
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

// privateStateDir creates the state directory, or tightens an existing
// one, so that only its owner may enter it: it holds the database and the
// secret key, and the umask or an older install may have left it open to
// every local user. The guest image below it needs no access for others:
// QEMU opens the kernel, initrd and root disk while still root, before it
// switches to the unprivileged VMM user.
func privateStateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("system: create state dir: %w", err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("system: state dir: %w", err)
	}
	if info.Mode()&os.ModeSticky != 0 {
		// Tightening /tmp or the like would lock every other user out.
		return fmt.Errorf("system: state dir %s is a shared directory (sticky bit): give the daemon a directory of its own", dir)
	}
	if info.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, info.Mode().Perm()&0o700); err != nil {
			return fmt.Errorf("system: make state dir %s private: %w", dir, err)
		}
	}
	return nil
}

// lockStateDir makes sure only one daemon serves a state directory: a
// second one would "recover" the first one's live runs. The kernel drops
// the lock when the process dies, so a SIGKILLed daemon never blocks its
// successor.
func lockStateDir(dir string) (unlock func(), err error) {
	f, err := flock.TryLock(filepath.Join(dir, "daemon.lock"), flock.Exclusive)
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("system: another daemon is serving %s", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("system: %w", err)
	}
	return func() { f.Close() }, nil
}
