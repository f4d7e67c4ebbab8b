// Package web is the person-facing half of Ephemeral, served by `ephemeral
// serve` on the same origin as the /v1 API: the examples and their replays
// (the product page's layout: timeline played back at its recorded pace,
// answer, cost line, permissions, the exact curl and request.json),
// published runs, the playground, and accounts (register, sign in, API
// keys, runs, balance, connections), in English and German.
//
// Pages are rendered on the server with html/template; a few small ES
// modules (static/js) play timelines back, follow live runs over the
// API's event stream and drive the playground, which calls the /v1 API
// with the session cookie. Everything the pages show that a user, a model
// or a VM wrote is text: Markdown answers are rendered without raw HTML
// and with http(s) links only (markdown.go). Pages send a strict
// Content-Security-Policy (no inline script, nothing from another origin),
// and every asset is embedded in the binary, so the app works offline.
//
// Organisation isolation lives in the store: every read of a member's data
// goes through a store method that takes the organisation id the session
// resolved, as the API's do.
package web

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/accounts"
	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/forwarded"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

//go:embed templates static
var assets embed.FS

// Config is what the pages read and act on.
type Config struct {
	Store    *store.Store
	Accounts *accounts.Service
	Examples *example.Set
	// Models lists the models (a *registry.Registry's Models).
	Models       func() []registry.Status
	DefaultModel string
	// Retention is how long a run's content is kept (the permissions
	// table says so).
	Retention time.Duration
	// StarterCreditMicros is what registering credits (the form says so).
	StarterCreditMicros int64
	Logger              *slog.Logger
}

// Server serves the pages.
type Server struct {
	cfg    Config
	log    *slog.Logger
	pages  map[string]*template.Template
	static map[string]staticFile
}

type staticFile struct {
	body        []byte
	etag        string
	contentType string
}

// pageFiles are the page templates; each is parsed with the layout and
// the run layout.
var pageFiles = []string{"front", "replay", "signin", "password", "error", "account", "runs", "playground"}

// New parses the templates and loads the assets.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	s := &Server{cfg: cfg, log: cfg.Logger, pages: map[string]*template.Template{}, static: map[string]staticFile{}}
	funcs := template.FuncMap{
		"money": money.Format,
		"join":  strings.Join,
		"fileRow": func(l lang, p, c string) fileRowView {
			return fileRowView{L: l, Path: p, Content: c}
		},
	}
	for _, name := range pageFiles {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/run.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("web: parse %s: %w", name, err)
		}
		s.pages[name] = t
	}
	err := fs.WalkDir(assets, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		s.static[strings.TrimPrefix(p, "static/")] = staticFile{body: body, etag: `"` + hex.EncodeToString(sum[:8]) + `"`,
			contentType: contentType(p)}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("web: load assets: %w", err)
	}
	return s, nil
}

func contentType(p string) string {
	switch path.Ext(p) {
	case ".css":
		return "text/css; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".png":
		return "image/png"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

type fileRowView struct {
	L             lang
	Path, Content string
}

// Handler routes the pages. Forms that change state must come from this
// origin's own pages (http.CrossOriginProtection): a page of another site
// cannot make a signed-in browser sign out, create a key or delete a run.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.front)
	mux.HandleFunc("GET /examples/{name}", s.examplePage)
	mux.HandleFunc("GET /p/{slug}", s.publishedPage)
	mux.HandleFunc("GET /playground", s.playground)
	mux.HandleFunc("GET /register", s.registerForm)
	mux.HandleFunc("POST /register", s.register)
	mux.HandleFunc("GET /signin", s.signInForm)
	mux.HandleFunc("POST /signin", s.signIn)
	mux.HandleFunc("POST /signout", s.signOut)
	mux.HandleFunc("GET /lang/{code}", s.setLang)
	mux.HandleFunc("GET /account", s.member(s.account))
	mux.HandleFunc("POST /account/keys", s.member(s.createKey))
	mux.HandleFunc("POST /account/keys/{id}/revoke", s.member(s.revokeKey))
	mux.HandleFunc("GET /account/password", s.member(s.passwordForm))
	mux.HandleFunc("POST /account/password", s.member(s.changePassword))
	mux.HandleFunc("GET /account/runs", s.member(s.runsList))
	mux.HandleFunc("GET /account/runs/{id}", s.member(s.runPage))
	mux.HandleFunc("GET /account/runs/{id}/result", s.member(s.runResult))
	mux.HandleFunc("POST /account/runs/{id}/publish", s.member(s.publish))
	mux.HandleFunc("POST /account/runs/{id}/unpublish", s.member(s.unpublish))
	mux.HandleFunc("POST /account/runs/{id}/delete", s.member(s.deleteRun))
	mux.HandleFunc("GET /static/{file...}", s.serveStatic)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { s.notFound(w, r) })

	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l := requestLang(r)
		s.render(w, r, http.StatusForbidden, "error", l.T("error.forbidden"), nil,
			errorView{Heading: l.T("error.forbidden"), Message: l.T("error.forbidden.p")})
	}))
	return cop.Handler(mux)
}

// SecurityHeaders wraps every response of the daemon (pages and API): no
// script but this origin's files, nothing loaded from elsewhere, no
// framing, no content sniffing, no referrer to other sites.
func SecurityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
			"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("X-Frame-Options", "DENY")
		h.ServeHTTP(w, r)
	})
}

func (s *Server) serveStatic(w http.ResponseWriter, r *http.Request) {
	f, ok := s.static[r.PathValue("file")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", f.contentType)
	w.Header().Set("ETag", f.etag)
	w.Header().Set("Cache-Control", "no-cache")
	if r.Header.Get("If-None-Match") == f.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Write(f.body)
}

// pageData is what the layout reads; Body is the page's own.
type pageData struct {
	L         lang
	Title     string
	User      *store.User
	Available int64
	Path      string // this page, where sign-in and the language switch return
	Langs     []langChoice
	Flash     string
	FlashKind string
	JSText    map[string]string
	Body      any
}

type errorView struct{ Heading, Message string }

// render writes a page. user may be nil (signed out).
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, page, title string, user *store.User, body any) {
	s.renderFlash(w, r, status, page, title, user, body, "", "")
}

func (s *Server) renderFlash(w http.ResponseWriter, r *http.Request, status int, page, title string, user *store.User, body any, flash, kind string) {
	l := requestLang(r)
	d := pageData{L: l, Title: title, User: user, Path: r.URL.RequestURI(), Langs: languages, JSText: l.jsText(), Body: body,
		Flash: flash, FlashKind: kind}
	if user != nil {
		if bal, err := s.cfg.Store.Balance(r.Context(), user.OrgID); err == nil {
			d.Available = bal.Available
		}
		// A member's pages are theirs alone: no cache keeps them.
		w.Header().Set("Cache-Control", "no-store")
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	var buf bytes.Buffer
	if err := s.pages[page].ExecuteTemplate(&buf, "layout", d); err != nil {
		s.log.Error("render page", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(status)
	buf.WriteTo(w) // a failed write means the browser left
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	l := requestLang(r)
	s.render(w, r, http.StatusNotFound, "error", l.T("error.notfound"), s.currentUser(r),
		errorView{Heading: l.T("error.notfound"), Message: l.T("error.notfound.p")})
}

func (s *Server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Error("page failed", "method", r.Method, "path", r.URL.Path, "err", err)
	l := requestLang(r)
	s.render(w, r, http.StatusInternalServerError, "error", l.T("error.internal"), nil,
		errorView{Heading: l.T("error.internal"), Message: l.T("error.internal.p")})
}

// currentUser is the signed-in user, or nil.
func (s *Server) currentUser(r *http.Request) *store.User {
	if s.cfg.Accounts == nil || !accounts.HasSessionCookie(r) {
		return nil
	}
	sess, err := s.cfg.Accounts.Session(r.Context(), accounts.TokenFrom(r))
	if err != nil {
		if !errors.Is(err, accounts.ErrNoSession) {
			s.log.Warn("resolve session", "err", err)
		}
		return nil
	}
	return &sess.User
}

// member serves h to signed-in users and sends everyone else to sign in,
// coming back here afterwards (for a GET).
func (s *Server) member(h func(http.ResponseWriter, *http.Request, *store.User)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		u := s.currentUser(r)
		if u == nil {
			next := "/account"
			if r.Method == http.MethodGet {
				next = r.URL.RequestURI()
			}
			http.Redirect(w, r, "/signin?next="+url.QueryEscape(next), http.StatusSeeOther)
			return
		}
		h(w, r, u)
	}
}

// localPath returns next when it is a path on this site, else fallback:
// a sign-in link must not send the browser to another site afterwards.
func localPath(next, fallback string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return fallback
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return fallback
	}
	return u.RequestURI()
}

// clientAddr is the address rate limits count by: the connection's peer,
// or the client a trusted proxy names (package forwarded set RemoteAddr).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (s *Server) setLang(w http.ResponseWriter, r *http.Request) {
	if _, ok := langByCode(r.PathValue("code")); ok {
		http.SetCookie(w, &http.Cookie{Name: langCookie, Value: r.PathValue("code"), Path: "/", MaxAge: 365 * 24 * 3600,
			SameSite: http.SameSiteLaxMode, Secure: forwarded.Secure(r)})
	}
	http.Redirect(w, r, localPath(r.URL.Query().Get("next"), "/"), http.StatusSeeOther)
}

// newSlug is a published run's link: 128 random bits.
func newSlug() string {
	b := make([]byte, 16)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
