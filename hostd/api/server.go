// Package api serves Ephemeral's HTTP API: the /v1 runs API with its
// conventions (JSON errors naming the field, strict decoding, idempotency,
// live Server-Sent Events), /healthz, /metrics and the OpenAPI document.
package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// Config tunes request validation.
type Config struct {
	DefaultModel  string
	MaxCostMicros int64 // upper bound a single run may reserve
	// ValidateModel rejects models the daemon cannot run or price (400).
	// Nil accepts any name.
	ValidateModel func(model string) error
	Logger        *slog.Logger
}

type limits struct {
	defaultModel  string
	maxCostMicros int64
	validateModel func(string) error
}

// Server holds the API's dependencies.
type Server struct {
	store *store.Store
	runs  *runs.Service
	lim   limits
	log   *slog.Logger

	// closingCtx ends live event streams when the daemon shuts down,
	// since http.Server.Shutdown waits for handlers but does not cancel
	// them.
	closingCtx   context.Context
	CloseStreams context.CancelFunc // register with http.Server.RegisterOnShutdown
}

// New creates the API server.
func New(st *store.Store, svc *runs.Service, cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxCostMicros <= 0 {
		cfg.MaxCostMicros = 100_000_000
	}
	closingCtx, closeStreams := context.WithCancel(context.Background())
	return &Server{store: st, runs: svc, log: cfg.Logger, closingCtx: closingCtx, CloseStreams: closeStreams,
		lim: limits{defaultModel: cfg.DefaultModel, maxCostMicros: cfg.MaxCostMicros, validateModel: cfg.ValidateModel}}
}

// Handler routes every endpoint.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("GET /openapi.json", serveOpenAPI)
	mux.Handle("POST /v1/runs", s.authed(s.createRun))
	mux.Handle("GET /v1/runs", s.authed(s.listRuns))
	mux.Handle("GET /v1/runs/{id}", s.authed(s.getRun))
	mux.Handle("DELETE /v1/runs/{id}", s.authed(s.deleteRun))
	mux.Handle("POST /v1/runs/{id}/cancel", s.authed(s.cancelRun))
	mux.Handle("GET /v1/runs/{id}/events", s.authed(s.events))
	mux.Handle("GET /v1/runs/{id}/recording", s.authed(s.getRecording))
	mux.Handle("GET /v1/balance", s.authed(s.balance))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "not_found",
			Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return mux
}

type orgKey struct{}

// authed resolves the Bearer key to its organisation before h runs.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orgID, err := auth.Authenticate(r.Context(), s.store, r.Header.Get("Authorization"))
		if errors.Is(err, auth.ErrUnauthenticated) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ephemeral"`)
			writeError(w, &apiError{Status: http.StatusUnauthorized, Type: authentication, Code: "invalid_api_key",
				Message: "send a valid API key as Authorization: Bearer eph_..."})
			return
		}
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), orgKey{}, orgID)), orgID)
	})
}

func (s *Server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, &apiError{Status: http.StatusInternalServerError, Type: internal, Code: "internal_error",
		Message: "internal error; the request may be retried"})
}

// healthz answers liveness probes: the daemon serves and its database
// answers a read. It costs the same however many runs the database holds.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if err := s.store.Ping(r.Context()); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}
