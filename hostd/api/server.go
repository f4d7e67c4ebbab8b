// Package api serves Ephemeral's HTTP API: the /v1 runs API with its
// conventions (JSON errors naming the field, strict decoding of bodies and
// query parameters, 405 with Allow, idempotency, live Server-Sent Events,
// limits per API key and client address, requests that cannot work
// refused before anything is reserved), /healthz and the OpenAPI document
// (openapi.json, which openapi_test.go holds the handlers to); and, on a
// handler of its own meant for a loopback address, /metrics. Clients
// authenticate with an API key; browsers of the web app may use their
// session cookie instead, guarded against cross-site forgery.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/accounts"
	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
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
	// MinimumBudget is the least budget a run can get its model's first
	// answer with (agent.Executor.MinimumBudget); a request with less is
	// refused with it (400 budget_too_small). Nil: no minimum.
	MinimumBudget func(runs.Spec) (int64, error)
	Limits        Limits
	// Webhooks keeps the secrets webhook deliveries are signed with;
	// nil: runs may not name a webhook_url.
	Webhooks WebhookSecrets
	// CredentialRecheck is how often a live event stream checks that its
	// API key still works; default DefaultCredentialRecheck.
	CredentialRecheck time.Duration
	Logger            *slog.Logger

	// Models lists every model for GET /v1/models (a
	// *registry.Registry's Models). Nil lists none.
	Models func() []registry.Status
	// ExampleRequest returns the request of the example a run may
	// replay ("replay": name) and the model its recording used. Nil: no
	// run may replay.
	ExampleRequest func(name string) (request json.RawMessage, model string, ok bool)
	// Sessions, when set, lets browsers call the API with their session
	// cookie instead of an API key (an *accounts.Service).
	Sessions Sessions
}

// Sessions resolves a request's session cookie to the signed-in user's
// organisation; accounts.ErrNoSession means there is no live session.
type Sessions interface {
	SessionOrg(ctx context.Context, r *http.Request) (string, error)
}

// DefaultCredentialRecheck bounds how long an event stream outlives the
// revocation of its key.
const DefaultCredentialRecheck = 2 * time.Second

type limits struct {
	defaultModel  string
	maxCostMicros int64
	validateModel func(string) error
	minimumBudget func(runs.Spec) (int64, error)
	// usableModels lists the models runs may use now, by name.
	usableModels func() []string
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

	models         func() []registry.Status
	exampleRequest func(string) (json.RawMessage, string, bool)
	sessions       Sessions
	// crossOrigin refuses state-changing requests a browser sends from
	// another origin with the session cookie: cross-site request forgery.
	crossOrigin *http.CrossOriginProtection

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
		lim: limits{defaultModel: cfg.DefaultModel, maxCostMicros: cfg.MaxCostMicros, validateModel: cfg.ValidateModel,
			minimumBudget: cfg.MinimumBudget, usableModels: func() []string { return usableModels(cfg.Models) }},
		limiter: newLimiter(cfg.Limits), credentialRecheck: cfg.CredentialRecheck,
		models: cfg.Models, exampleRequest: cfg.ExampleRequest, sessions: cfg.Sessions,
		crossOrigin: http.NewCrossOriginProtection(), webhooks: cfg.Webhooks}
}

// Handler routes every endpoint of the API. /metrics is not one of them:
// it sums up every organisation, so it is served by MetricsHandler, on an
// address of its own. Each route names the query parameters it takes;
// any other is a 400, like an unknown field of a body.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", s.public(s.healthz))
	mux.Handle("GET /openapi.json", s.public(serveOpenAPI))
	mux.Handle("POST /v1/runs", s.authed(runCreation, s.createRun))
	mux.Handle("GET /v1/runs", s.authed(otherRequest, s.listRuns, "limit", "starting_after", "status"))
	mux.Handle("GET /v1/runs/{id}", s.authed(otherRequest, s.getRun))
	mux.Handle("DELETE /v1/runs/{id}", s.authed(otherRequest, s.deleteRun))
	mux.Handle("POST /v1/runs/{id}/cancel", s.authed(otherRequest, s.cancelRun))
	mux.Handle("GET /v1/runs/{id}/events", s.authed(otherRequest, s.events, "after"))
	mux.Handle("GET /v1/runs/{id}/recording", s.authed(otherRequest, s.getRecording))
	mux.Handle("GET /v1/runs/{id}/outputs/{path...}", s.authed(otherRequest, s.getOutput))
	mux.Handle("GET /v1/runs/{id}/webhook_deliveries", s.authed(otherRequest, s.getWebhookDeliveries))
	mux.Handle("POST /v1/webhook_secret/rotate", s.authed(otherRequest, s.rotateWebhookSecret))
	mux.Handle("GET /v1/balance", s.authed(otherRequest, s.balance))
	mux.Handle("GET /v1/models", s.public(s.listModels))
	mux.Handle("/", s.public(noRoute(mux)))
	return mux
}

// MetricsHandler serves /metrics (Prometheus text) and nothing else.
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("/", noRoute(mux))
	return mux
}

// noRoute answers what mux routes nowhere else: 405 with Allow for a path
// it serves with other methods, 404 for any other. (ServeMux would answer
// the 405 itself, but its catch-all route, this one, matches every
// method first.)
func noRoute(mux *http.ServeMux) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if _, pattern := mux.Handler(&http.Request{Method: m, URL: r.URL, Host: r.Host}); pattern != "/" && pattern != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) == 0 {
			writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "not_found",
				Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
			return
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: invalidRequest, Code: "method_not_allowed",
			Message: fmt.Sprintf("%s %s is not an endpoint: this path takes %s", r.Method, r.URL.Path, strings.Join(allow, ", "))})
	}
}

// public counts a request that needs no key against its address's share,
// then checks its query parameters against those h takes.
func (s *Server) public(h http.HandlerFunc, query ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !take(w, s.limiter.perAddress[otherRequest], clientAddress(r), "this address") {
			return
		}
		if apiErr := checkQuery(r, query); apiErr != nil {
			writeError(w, apiErr)
			return
		}
		h(w, r)
	})
}

// checkQuery refuses a query parameter the endpoint does not take, or one
// given twice, as a body's fields are refused: a misspelt filter must not
// silently list everything.
func checkQuery(r *http.Request, takes []string) *apiError {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: "invalid_query",
			Message: "the query string is not valid: " + err.Error()}
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		switch {
		case !slices.Contains(takes, name):
			msg := fmt.Sprintf("unknown query parameter %q", name)
			if i := slices.IndexFunc(takes, func(t string) bool { return strings.EqualFold(t, name) }); i >= 0 {
				msg += fmt.Sprintf(" (names are case-sensitive: did you mean %q?)", takes[i])
			} else if len(takes) == 0 {
				msg += ": this endpoint takes none"
			} else {
				msg += ": this endpoint takes " + strings.Join(takes, ", ")
			}
			return badParam(name, "unknown_parameter", msg)
		case len(q[name]) > 1:
			return badParam(name, "duplicate_parameter", fmt.Sprintf("query parameter %q is given more than once", name))
		}
	}
	return nil
}

type principalKey struct{}

// authed counts the request against its address's share of kind, resolves
// the Bearer key (or a browser's session cookie) to its organisation,
// counts the request against the key's share, checks its query parameters
// against those h takes, then runs h. The address is counted first so
// that a flood of bad keys is held to the address's share before it costs
// a key lookup.
func (s *Server) authed(kind requestKind, h func(http.ResponseWriter, *http.Request, string), query ...string) http.Handler {
	h = withQuery(h, query)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !take(w, s.limiter.perAddress[kind], clientAddress(r), "this address") {
			return
		}
		if s.usesSession(r) {
			s.sessionAuthed(kind, w, r, h)
			return
		}
		p, err := auth.Authenticate(r.Context(), s.store, r.Header.Get("Authorization"))
		if errors.Is(err, auth.ErrUnauthenticated) {
			writeUnauthorized(w, "invalid_api_key", "send a valid API key as Authorization: Bearer eph_...")
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

// withQuery runs h only for a request whose query parameters are among
// takes.
func withQuery(h func(http.ResponseWriter, *http.Request, string), takes []string) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, orgID string) {
		if apiErr := checkQuery(r, takes); apiErr != nil {
			writeError(w, apiErr)
			return
		}
		h(w, r, orgID)
	}
}

// writeUnauthorized answers 401 with the challenge that says how to
// authenticate, as every 401 must carry.
func writeUnauthorized(w http.ResponseWriter, code, message string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="ephemeral"`)
	writeError(w, &apiError{Status: http.StatusUnauthorized, Type: authentication, Code: code, Message: message})
}

// usesSession reports whether the request authenticates with the session
// cookie: it carries one and no Authorization header.
func (s *Server) usesSession(r *http.Request) bool {
	return s.sessions != nil && r.Header.Get("Authorization") == "" && accounts.HasSessionCookie(r)
}

// sessionPrincipal names a session's organisation where limits count keys:
// a signed-in browser gets the share of one key.
func sessionPrincipal(orgID string) auth.Principal {
	return auth.Principal{KeyID: "session:" + orgID, OrgID: orgID}
}

// sessionAuthed serves a browser that sent its session cookie. A cookie
// goes with every request the browser makes to this origin, also those a
// page of another origin makes it send: a request that changes state must
// come from a page of this origin (Sec-Fetch-Site, else Origin).
func (s *Server) sessionAuthed(kind requestKind, w http.ResponseWriter, r *http.Request, h func(http.ResponseWriter, *http.Request, string)) {
	orgID, err := s.sessions.SessionOrg(r.Context(), r)
	if errors.Is(err, accounts.ErrNoSession) {
		writeUnauthorized(w, "session_expired", "the session has ended: sign in again, or send an API key as Authorization: Bearer eph_...")
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if err := s.crossOrigin.Check(r); err != nil {
		writeError(w, &apiError{Status: http.StatusForbidden, Type: invalidRequest, Code: "cross_origin_request",
			Message: "a request with the session cookie that changes state must come from this site's own pages"})
		return
	}
	p := sessionPrincipal(orgID)
	if !take(w, s.limiter.perKey[kind], p.KeyID, "this session") {
		return
	}
	h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)), orgID)
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
