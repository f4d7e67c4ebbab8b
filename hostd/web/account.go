package web

import (
	"errors"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/accounts"
	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

type signInView struct {
	Heading       string
	Action        string
	Register      bool
	Next          string
	Email         string
	Error         string
	StarterCredit int64
}

func (s *Server) registerForm(w http.ResponseWriter, r *http.Request) {
	l := requestLang(r)
	s.render(w, r, http.StatusOK, "signin", l.T("register.h"), s.currentUser(r), signInView{Heading: l.T("register.h"),
		Action: "/register", Register: true, Next: localPath(r.URL.Query().Get("next"), "/playground"),
		StarterCredit: s.cfg.StarterCreditMicros})
}

func (s *Server) signInForm(w http.ResponseWriter, r *http.Request) {
	l := requestLang(r)
	s.render(w, r, http.StatusOK, "signin", l.T("signin.h"), s.currentUser(r), signInView{Heading: l.T("signin.h"),
		Action: "/signin", Next: localPath(r.URL.Query().Get("next"), "/account")})
}

// retryMinutes words a rate limit's wait.
func retryMinutes(w http.ResponseWriter, throttled *accounts.ThrottledError) int {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(throttled.RetryAfter.Seconds()))))
	return int(math.Ceil(throttled.RetryAfter.Minutes()))
}

func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	l := requestLang(r)
	next := localPath(r.PostFormValue("next"), "/playground")
	email := r.PostFormValue("email")
	token, _, err := s.cfg.Accounts.Register(r.Context(), email, r.PostFormValue("password"), clientAddr(r), accounts.TokenFrom(r))
	if err == nil {
		s.cfg.Accounts.SetCookie(w, r, token)
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	v := signInView{Heading: l.T("register.h"), Action: "/register", Register: true, Next: next, Email: email,
		StarterCredit: s.cfg.StarterCreditMicros}
	status := http.StatusBadRequest
	var throttled *accounts.ThrottledError
	switch {
	case errors.Is(err, accounts.ErrEmailTaken):
		v.Error, status = l.T("register.taken"), http.StatusConflict
	case errors.Is(err, accounts.ErrInvalidEmail):
		v.Error = l.T("register.email")
	case errors.Is(err, accounts.ErrWeakPassword):
		v.Error = l.T("register.weak")
	case errors.As(err, &throttled):
		v.Error, status = l.T("register.throttled", retryMinutes(w, throttled)), http.StatusTooManyRequests
	default:
		s.internalError(w, r, err)
		return
	}
	s.render(w, r, status, "signin", v.Heading, nil, v)
}

func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	l := requestLang(r)
	next := localPath(r.PostFormValue("next"), "/account")
	email := r.PostFormValue("email")
	token, _, err := s.cfg.Accounts.SignIn(r.Context(), email, r.PostFormValue("password"), clientAddr(r), accounts.TokenFrom(r))
	if err == nil {
		s.cfg.Accounts.SetCookie(w, r, token)
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	v := signInView{Heading: l.T("signin.h"), Action: "/signin", Next: next, Email: email}
	var throttled *accounts.ThrottledError
	status := http.StatusUnauthorized
	switch {
	case errors.Is(err, accounts.ErrBadCredentials):
		v.Error = l.T("signin.bad")
	case errors.As(err, &throttled):
		v.Error, status = l.T("signin.throttled", retryMinutes(w, throttled)), http.StatusTooManyRequests
	default:
		s.internalError(w, r, err)
		return
	}
	s.render(w, r, status, "signin", v.Heading, nil, v)
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Accounts.SignOut(r.Context(), accounts.TokenFrom(r)); err != nil {
		s.internalError(w, r, err)
		return
	}
	accounts.ClearCookie(w, r)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

type keyRow struct {
	ID, Prefix, Created, LastUsed string
	Revoked                       bool
}

type accountView struct {
	Balance     ledger.Account
	Keys        []keyRow
	NewKey      string
	Connections []store.ConnectionRecord
}

// flashes are the results a redirect back to the account page reports,
// by a fixed code: no text from the URL is ever shown.
var flashes = map[string]string{"revoked": "keys.revoked.done", "password": "password.done"}

func (s *Server) account(w http.ResponseWriter, r *http.Request, u *store.User) {
	s.renderAccount(w, r, u, "")
}

func (s *Server) renderAccount(w http.ResponseWriter, r *http.Request, u *store.User, newKey string) {
	l := requestLang(r)
	ctx := r.Context()
	bal, err := s.cfg.Store.Balance(ctx, u.OrgID)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	keys, err := s.cfg.Store.Keys(ctx, u.OrgID)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	conns, err := s.cfg.Store.Connections(ctx, u.OrgID)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	v := accountView{Balance: bal, NewKey: newKey, Connections: conns}
	for _, k := range keys {
		row := keyRow{ID: k.ID, Prefix: auth.Prefix + k.ID + "_…", Created: l.dateTime(k.CreatedAt), LastUsed: l.T("keys.never"),
			Revoked: k.RevokedAt != nil}
		if k.LastUsedAt != nil {
			row.LastUsed = l.dateTime(*k.LastUsedAt)
		}
		v.Keys = append(v.Keys, row)
	}
	flash := ""
	if key, ok := flashes[r.URL.Query().Get("done")]; ok {
		flash = l.T(key)
	}
	s.renderFlash(w, r, http.StatusOK, "account", l.T("account.h"), u, v, flash, "ok")
}

// createKey issues a key for the member and shows it once, in this
// response only (never stored, never in a URL).
func (s *Server) createKey(w http.ResponseWriter, r *http.Request, u *store.User) {
	k := auth.NewKey()
	if err := s.cfg.Store.AddKey(r.Context(), store.Member{ID: u.MemberID, OrgID: u.OrgID, Email: u.Email}, k.ID, k.Hash); err != nil {
		s.internalError(w, r, err)
		return
	}
	s.renderAccount(w, r, u, k.Secret)
}

var keyIDPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request, u *store.User) {
	id := r.PathValue("id")
	if !keyIDPattern.MatchString(id) {
		s.notFound(w, r)
		return
	}
	err := s.cfg.Store.RevokeOrgKey(r.Context(), u.OrgID, id, time.Now())
	if errors.Is(err, store.ErrNotFound) {
		s.notFound(w, r)
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	http.Redirect(w, r, "/account?done=revoked", http.StatusSeeOther)
}

type passwordView struct{ Error string }

func (s *Server) passwordForm(w http.ResponseWriter, r *http.Request, u *store.User) {
	s.render(w, r, http.StatusOK, "password", requestLang(r).T("password.h"), u, passwordView{})
}

func (s *Server) changePassword(w http.ResponseWriter, r *http.Request, u *store.User) {
	l := requestLang(r)
	token, err := s.cfg.Accounts.ChangePassword(r.Context(), *u, accounts.TokenFrom(r), r.PostFormValue("current"), r.PostFormValue("new"))
	switch {
	case err == nil:
		s.cfg.Accounts.SetCookie(w, r, token)
		http.Redirect(w, r, "/account?done=password", http.StatusSeeOther)
	case errors.Is(err, accounts.ErrBadCredentials):
		s.render(w, r, http.StatusUnauthorized, "password", l.T("password.h"), u, passwordView{Error: l.T("password.bad")})
	case errors.Is(err, accounts.ErrWeakPassword):
		s.render(w, r, http.StatusBadRequest, "password", l.T("password.h"), u, passwordView{Error: l.T("register.weak")})
	default:
		s.internalError(w, r, err)
	}
}

type runRow struct {
	ID, Short, StatusText, Cost, Created string
	Status                               store.Status
}

type filterLink struct {
	Label, URL string
	Current    bool
}

const runsPerPage = 25

func (s *Server) runsList(w http.ResponseWriter, r *http.Request, u *store.User) {
	l := requestLang(r)
	q := r.URL.Query()
	status := store.Status(q.Get("status"))
	known := status == ""
	body := struct {
		Filters []filterLink
		Runs    []runRow
		Next    string
	}{}
	body.Filters = append(body.Filters, filterLink{Label: l.T("runs.all"), URL: "/account/runs", Current: status == ""})
	for _, st := range store.Statuses {
		known = known || st == status
		body.Filters = append(body.Filters, filterLink{Label: l.T("status." + string(st)),
			URL: "/account/runs?status=" + string(st), Current: st == status})
	}
	if !known {
		s.notFound(w, r)
		return
	}
	after := q.Get("after")
	if after != "" && !runIDPattern.MatchString(after) {
		after = ""
	}
	list, more, err := s.cfg.Store.ListRunsWithStatus(r.Context(), u.OrgID, status, after, runsPerPage)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.internalError(w, r, err)
		return
	}
	for _, run := range list {
		body.Runs = append(body.Runs, runRow{ID: run.ID, Short: run.ID[:12] + "…", Status: run.Status,
			StatusText: l.T("status." + string(run.Status)),
			Cost:       l.T("spent", money.Format(run.Charged), money.Format(run.Reserved)), Created: l.dateTime(run.CreatedAt)})
	}
	if more {
		next := url.Values{"after": {list[len(list)-1].ID}}
		if status != "" {
			next.Set("status", string(status))
		}
		body.Next = "/account/runs?" + next.Encode()
	}
	s.render(w, r, http.StatusOK, "runs", l.T("runs.h"), u, body)
}

var runIDPattern = regexp.MustCompile(`^run_[0-9a-f]{32}$`)

// ownRun loads one of the member's runs: another organisation's run is as
// absent as one that never existed.
func (s *Server) ownRun(w http.ResponseWriter, r *http.Request, u *store.User) (store.Run, bool) {
	id := r.PathValue("id")
	if runIDPattern.MatchString(id) {
		run, err := s.cfg.Store.GetRun(r.Context(), u.OrgID, id)
		if err == nil {
			return run, true
		}
		if !errors.Is(err, store.ErrNotFound) {
			s.internalError(w, r, err)
			return store.Run{}, false
		}
	}
	s.notFound(w, r)
	return store.Run{}, false
}

// ownRunView is a member's run in the product page's layout, live while
// it runs.
func (s *Server) ownRunView(r *http.Request, l lang, u *store.User, run store.Run) (*replayView, error) {
	list, err := s.cfg.Store.Events(r.Context(), run.ID, 0, maxEvents)
	if err != nil {
		return nil, err
	}
	v := newReplayView(l, "own", runFromStore(run), eventsFromStore(list), nil, s.cfg.Retention)
	v.Title = l.T("run.title", run.ID)
	v.Summary = promptSummary(run.Request)
	v.WatchHeading = l.T("watch.own")
	v.Intro = l.T("intro.own", l.dateTime(run.CreatedAt), run.Model)
	v.AnswerLabel = l.T("answer.output")
	v.PlaygroundURL = "/playground?run=" + run.ID
	v.SignedIn, v.Own = true, true
	v.CanDelete = run.Status.Terminal() && run.PurgedAt == nil
	switch {
	case !run.Status.Terminal():
		v.PublishHint = l.T("run.publish.active")
	case run.ZeroRetention:
		v.PublishHint = l.T("run.publish.zdr")
	case run.PurgedAt != nil:
		v.PublishHint = l.T("run.publish.purged")
	default:
		p, err := s.cfg.Store.PublicationOf(r.Context(), u.OrgID, run.ID)
		switch {
		case err == nil:
			v.PublicURL = "/p/" + p.Slug
		case errors.Is(err, store.ErrNotFound):
			v.CanPublish = true
		default:
			return nil, err
		}
	}
	return v, nil
}

func (s *Server) runPage(w http.ResponseWriter, r *http.Request, u *store.User) {
	run, ok := s.ownRun(w, r, u)
	if !ok {
		return
	}
	l := requestLang(r)
	v, err := s.ownRunView(r, l, u, run)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "replay", v.Title, u, v)
}

// runResult is the answer and cost line of a finished run: the fragment a
// live page fetches when the run's event stream ends.
func (s *Server) runResult(w http.ResponseWriter, r *http.Request, u *store.User) {
	run, ok := s.ownRun(w, r, u)
	if !ok {
		return
	}
	v, err := s.ownRunView(r, requestLang(r), u, run)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := s.pages["replay"].ExecuteTemplate(w, "result", v); err != nil {
		s.log.Error("render result", "run", run.ID, "err", err)
	}
}

// publish gives the run a public page under a random slug: its link
// cannot be derived from the run id.
func (s *Server) publish(w http.ResponseWriter, r *http.Request, u *store.User) {
	run, ok := s.ownRun(w, r, u)
	if !ok {
		return
	}
	_, err := s.cfg.Store.PublishRun(r.Context(), u.OrgID, run.ID, newSlug(), time.Now())
	switch {
	case err == nil:
		http.Redirect(w, r, "/account/runs/"+run.ID, http.StatusSeeOther)
	case errors.Is(err, store.ErrZeroRetention), errors.Is(err, store.ErrPurged), errors.Is(err, store.ErrActive):
		// The page explains why; the refusal is a conflict with the
		// run's state.
		l := requestLang(r)
		v, verr := s.ownRunView(r, l, u, run)
		if verr != nil {
			s.internalError(w, r, verr)
			return
		}
		s.renderFlash(w, r, http.StatusConflict, "replay", v.Title, u, v, v.PublishHint, "error")
	case errors.Is(err, store.ErrNotFound):
		s.notFound(w, r)
	default:
		s.internalError(w, r, err)
	}
}

func (s *Server) unpublish(w http.ResponseWriter, r *http.Request, u *store.User) {
	run, ok := s.ownRun(w, r, u)
	if !ok {
		return
	}
	if err := s.cfg.Store.UnpublishRun(r.Context(), u.OrgID, run.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.internalError(w, r, err)
		return
	}
	http.Redirect(w, r, "/account/runs/"+run.ID, http.StatusSeeOther)
}

// deleteRun purges the run's content, as DELETE /v1/runs/{id} does.
func (s *Server) deleteRun(w http.ResponseWriter, r *http.Request, u *store.User) {
	run, ok := s.ownRun(w, r, u)
	if !ok {
		return
	}
	if _, err := s.cfg.Store.PurgeRun(r.Context(), u.OrgID, run.ID, time.Now()); err != nil && !errors.Is(err, store.ErrActive) {
		s.internalError(w, r, err)
		return
	}
	// Old WAL frames hold the purged content until a checkpoint.
	if err := s.cfg.Store.Checkpoint(r.Context()); err != nil {
		s.log.Warn("checkpoint after purge", "run", run.ID, "err", err)
	}
	http.Redirect(w, r, "/account/runs/"+run.ID, http.StatusSeeOther)
}
