package web

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// exampleView renders an example in the product page's layout.
func (s *Server) exampleView(l lang, ex example.Example, signedIn bool) (*replayView, error) {
	run, err := runFromAPI(ex.Run)
	if err != nil {
		return nil, err
	}
	var events []eventView
	if err := json.Unmarshal(ex.Events, &events); err != nil {
		return nil, err
	}
	v := newReplayView(l, "example", run, events, ex.Request, s.cfg.Retention)
	v.Title, v.Summary, v.HowItWorks = ex.Title.In(l.Code), ex.Summary.In(l.Code), ex.HowItWorks.In(l.Code)
	v.WatchHeading = l.T("watch.example")
	v.Intro = l.T("intro.recorded", l.date(run.CreatedAt), run.Model)
	v.AnswerLabel = l.T("answer.recorded")
	v.Autoplay = true
	v.PlaygroundURL = "/playground?example=" + url.QueryEscape(ex.Name)
	v.SignedIn = signedIn
	return v, nil
}

type exampleCard struct {
	Name, Title, Summary string
	Tags                 []string
}

func (s *Server) front(w http.ResponseWriter, r *http.Request) {
	l := requestLang(r)
	user := s.currentUser(r)
	all := s.cfg.Examples.All()
	featured, err := s.exampleView(l, all[0], user != nil)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	body := struct {
		Examples []exampleCard
		Featured *replayView
	}{Featured: featured}
	for _, ex := range all {
		req, _ := parseRequest(ex.Request)
		body.Examples = append(body.Examples, exampleCard{Name: ex.Name, Title: ex.Title.In(l.Code), Summary: ex.Summary.In(l.Code), Tags: l.tags(req)})
	}
	s.render(w, r, http.StatusOK, "front", "", user, body)
}

func (s *Server) examplePage(w http.ResponseWriter, r *http.Request) {
	ex, ok := s.cfg.Examples.Get(r.PathValue("name"))
	if !ok {
		s.notFound(w, r)
		return
	}
	l := requestLang(r)
	user := s.currentUser(r)
	v, err := s.exampleView(l, ex, user != nil)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "replay", v.Title, user, v)
}

// maxEvents bounds a page's timeline; runs are bounded by their turns.
const maxEvents = 5000

// publishedPage shows a published run to anyone with its link, read-only:
// what the run's organisation chose to show, nothing about the
// organisation itself.
func (s *Server) publishedPage(w http.ResponseWriter, r *http.Request) {
	run, err := s.cfg.Store.PublishedRun(r.Context(), r.PathValue("slug"))
	if errors.Is(err, store.ErrNotFound) {
		s.notFound(w, r)
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	list, err := s.cfg.Store.Events(r.Context(), run.ID, 0, maxEvents)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	l := requestLang(r)
	user := s.currentUser(r)
	v := newReplayView(l, "published", runFromStore(run), eventsFromStore(list), nil, s.cfg.Retention)
	v.Title = l.T("run.title", run.ID)
	v.Summary = promptSummary(run.Request)
	v.WatchHeading = l.T("watch.published")
	v.Intro = l.T("intro.published", l.date(run.CreatedAt), run.Model)
	v.AnswerLabel = l.T("answer.output")
	v.Autoplay = true
	v.PlaygroundURL = "/playground?published=" + url.QueryEscape(r.PathValue("slug"))
	v.SignedIn = user != nil
	s.render(w, r, http.StatusOK, "replay", v.Title, user, v)
}

// promptSummary is the start of a run's prompt, as its page's summary.
func promptSummary(request json.RawMessage) string {
	req, ok := parseRequest(request)
	if !ok {
		return ""
	}
	p := strings.Join(strings.Fields(req.Prompt), " ")
	if r := []rune(p); len(r) > 240 {
		p = string(r[:240]) + "…"
	}
	return p
}

// playgroundForm is the playground's fields, filled from a request.
type playgroundForm struct {
	Prompt            string
	Model             string
	Shell, Web        bool
	Connections       map[string]map[string]bool // name → method → granted
	Files             []fileRowView
	ZeroDataRetention bool
	Budget            string // dollars
	TimeoutSeconds    int64
	Replay            bool
}

type modelOption struct {
	Name, Label string
	Selected    bool
}

type connectionOption struct {
	Name    string
	Methods []methodOption
}

type methodOption struct {
	Method  string
	Checked bool
}

type playgroundView struct {
	Form        playgroundForm
	Models      []modelOption
	Connections []connectionOption
	Examples    []exampleCard
	Example     string // the example the form was filled from
	Offline     bool
	CannotRun   bool
	Here        string
	Curl        string
	RequestJSON string
}

// dollars writes micros as a decimal dollar amount for the budget field.
func dollars(micros int64) string {
	s := money.Format(micros)
	return strings.ReplaceAll(strings.TrimPrefix(s, "$"), ",", "")
}

// playground shows the request form, filled from an example
// (?example=name), a published run (?published=slug) or one of the
// member's runs (?run=id), else empty.
func (s *Server) playground(w http.ResponseWriter, r *http.Request) {
	l := requestLang(r)
	user := s.currentUser(r)
	q := r.URL.Query()
	v := playgroundView{Here: r.URL.RequestURI(), Curl: curlCommand}
	var source json.RawMessage
	exampleModel := ""
	if name := q.Get("example"); name != "" {
		if ex, ok := s.cfg.Examples.Get(name); ok {
			source, v.Example, exampleModel = ex.Request, ex.Name, ex.Model()
		}
	} else if slug := q.Get("published"); slug != "" {
		if run, err := s.cfg.Store.PublishedRun(r.Context(), slug); err == nil {
			source = run.Request
		}
	} else if id := q.Get("run"); id != "" && user != nil {
		if run, err := s.cfg.Store.GetRun(r.Context(), user.OrgID, id); err == nil {
			source = run.Request
		}
	}
	req, ok := parseRequest(source)
	if !ok {
		// Nothing to start from (or nothing left of it: a purged run).
		source, v.Example, exampleModel = nil, "", ""
		req = requestView{Shell: true, TimeoutSeconds: 120, MaxCostMicros: 40_000}
	}
	switch {
	case req.Model != "":
	case exampleModel != "":
		// An example that names no model ran with its recording's.
		req.Model = exampleModel
	default:
		req.Model = s.cfg.DefaultModel
	}
	models := s.cfg.Models()
	if req.Model == "" {
		// No default model: the form starts on the first usable one,
		// which the request then names.
		if i := slices.IndexFunc(models, func(m registry.Status) bool { return m.Usable }); i >= 0 {
			req.Model = models[i].Name
		}
	}
	usable := false
	for _, m := range models {
		usable = usable || m.Usable
		label := m.Name
		switch {
		case m.Price == nil:
			label += " — " + l.T("pg.model.noprice")
		default:
			label += " — " + l.T("pg.model.price", dollars(m.Price.InputMicrosPerMTok), dollars(m.Price.OutputMicrosPerMTok))
		}
		if !m.ProviderConfigured {
			label += " (" + l.T("pg.model.off") + ")"
		}
		v.Models = append(v.Models, modelOption{Name: m.Name, Label: label, Selected: m.Name == req.Model})
	}
	v.Offline = !usable
	// Offline, the form's own request cannot run; an example's replay can.
	v.CannotRun = v.Offline && v.Example == ""
	f := playgroundForm{Prompt: req.Prompt, Model: req.Model, Shell: req.Shell, Web: req.Web,
		ZeroDataRetention: req.ZeroDataRetention, Budget: dollars(req.MaxCostMicros), TimeoutSeconds: req.TimeoutSeconds,
		Connections: map[string]map[string]bool{}, Replay: v.Example != "" && (v.Offline || req.Replay != "")}
	for _, c := range req.Connections {
		f.Connections[c.Name] = map[string]bool{}
		for _, m := range c.Methods {
			f.Connections[c.Name][m] = true
		}
	}
	for _, file := range req.Files {
		f.Files = append(f.Files, fileRowView{L: l, Path: file.Path, Content: file.Content})
	}
	v.Form = f
	conns, err := s.connectionOptions(r, user, f.Connections)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	v.Connections = conns
	for _, ex := range s.cfg.Examples.All() {
		v.Examples = append(v.Examples, exampleCard{Name: ex.Name, Title: ex.Title.In(l.Code)})
	}
	if source != nil {
		v.RequestJSON = prettyJSON(source)
	}
	s.render(w, r, http.StatusOK, "playground", l.T("pg.h"), user, v)
}

// connectionOptions lists the connections the form offers: the member's
// organisation's, or, signed out, the example connections every new
// organisation gets; plus any the request names, so that it is shown as
// it is.
func (s *Server) connectionOptions(r *http.Request, user *store.User, granted map[string]map[string]bool) ([]connectionOption, error) {
	var out []connectionOption
	seen := map[string]bool{}
	add := func(name string, methods []string) {
		seen[name] = true
		o := connectionOption{Name: name}
		for _, m := range methods {
			o.Methods = append(o.Methods, methodOption{Method: m, Checked: granted[name][m]})
		}
		out = append(out, o)
	}
	if user != nil {
		list, err := s.cfg.Store.Connections(r.Context(), user.OrgID)
		if err != nil {
			return nil, err
		}
		for _, c := range list {
			add(c.Name, c.Methods)
		}
	} else {
		c := examplecrm.Connection()
		add(c.Name, c.Methods)
	}
	for _, name := range slices.Sorted(maps.Keys(granted)) {
		if !seen[name] {
			add(name, slices.Sorted(maps.Keys(granted[name])))
		}
	}
	return out, nil
}
