// Package api serves Ephemeral's HTTP API: the /v1 runs API with its
// conventions (JSON errors naming the field, strict decoding, idempotency,
// live Server-Sent Events, limits per API key and client address), /healthz
// and the OpenAPI document; and, on a handler of its own meant for a
// loopback address, /metrics.
package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// Config tunes request validation and limits.
type Config struct {
	DefaultModel  string
	MaxCostMicros int64 // upper bound a single run may reserve
	// ValidateModel rejects models the daemon cannot run or price (400).
	// Nil accepts any name.
	ValidateModel func(model string) error
	Limits        Limits
	// Webhooks keeps the secrets webhook deliveries are signed with;
	// nil: runs may not name a webhook_url.
	Webhooks WebhookSecrets
	// CredentialRecheck is how often a live event stream checks that its
	// API key still works; default DefaultCredentialRecheck.
	CredentialRecheck time.Duration
	Logger            *slog.Logger
}

// DefaultCredentialRecheck bounds how long an event stream outlives the
// revocation of its key.
const DefaultCredentialRecheck = 2 * time.Second

type limits struct {
	defaultModel  string
	maxCostMicros int64
	validateModel func(string) error
}

// Server holds the API's dependencies.
type Server struct {
	store             *store.Store
	runs              *runs.Service
	lim               limits
	limiter           *limiter
	credentialRecheck time.Duration
	webhooks          WebhookSecrets
	log               *slog.Logger

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
	if cfg.CredentialRecheck <= 0 {
		cfg.CredentialRecheck = DefaultCredentialRecheck
	}
	closingCtx, closeStreams := context.WithCancel(context.Background())
	return &Server{store: st, runs: svc, log: cfg.Logger, closingCtx: closingCtx, CloseStreams: closeStreams,
		lim:     limits{defaultModel: cfg.DefaultModel, maxCostMicros: cfg.MaxCostMicros, validateModel: cfg.ValidateModel},
		limiter: newLimiter(cfg.Limits), credentialRecheck: cfg.CredentialRecheck, webhooks: cfg.Webhooks}
}

// Handler routes every endpoint of the API. /metrics is not one of them:
// it sums up every organisation, so it is served by MetricsHandler, on an
// address of its own.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", s.public(s.healthz))
	mux.Handle("GET /openapi.json", s.public(serveOpenAPI))
	mux.Handle("POST /v1/runs", s.authed(runCreation, s.createRun))
	mux.Handle("GET /v1/runs", s.authed(otherRequest, s.listRuns))
	mux.Handle("GET /v1/runs/{id}", s.authed(otherRequest, s.getRun))
	mux.Handle("DELETE /v1/runs/{id}", s.authed(otherRequest, s.deleteRun))
	mux.Handle("POST /v1/runs/{id}/cancel", s.authed(otherRequest, s.cancelRun))
	mux.Handle("GET /v1/runs/{id}/events", s.authed(otherRequest, s.events))
	mux.Handle("GET /v1/runs/{id}/recording", s.authed(otherRequest, s.getRecording))
	mux.Handle("GET /v1/runs/{id}/outputs/{path...}", s.authed(otherRequest, s.getOutput))
	mux.Handle("GET /v1/runs/{id}/webhook_deliveries", s.authed(otherRequest, s.getWebhookDeliveries))
	mux.Handle("POST /v1/webhook_secret/rotate", s.authed(otherRequest, s.rotateWebhookSecret))
	mux.Handle("GET /v1/balance", s.authed(otherRequest, s.balance))
	mux.Handle("/", s.public(notFound))
	return mux
}

// MetricsHandler serves /metrics (Prometheus text) and nothing else.
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("/", notFound)
	return mux
}

func notFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "not_found",
		Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
}

// public counts a request that needs no key against its address's share.
func (s *Server) public(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if take(w, s.limiter.perAddress[otherRequest], clientAddress(r), "this address") {
			h(w, r)
		}
	})
}

type principalKey struct{}

// authed counts the request against its address's share of kind, resolves
// the Bearer key to its organisation, counts the request against the key's
// share, then runs h. The address is counted first so that a flood of bad
// keys is held to the address's share before it costs a key lookup.
func (s *Server) authed(kind requestKind, h func(http.ResponseWriter, *http.Request, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !take(w, s.limiter.perAddress[kind], clientAddress(r), "this address") {
			return
		}
		p, err := auth.Authenticate(r.Context(), s.store, r.Header.Get("Authorization"))
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
		if !take(w, s.limiter.perKey[kind], p.KeyID, "this API key") {
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)), p.OrgID)
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
