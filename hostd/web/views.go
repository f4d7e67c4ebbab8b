package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// A page shows a run the same way whether it comes from an example
// document (the API's JSON, recorded) or from the database (a member's own
// run, a published one): both become a runView and events.

// runView is what the pages show of a run.
type runView struct {
	ID            string
	Status        store.Status
	Model         string
	CreatedAt     time.Time
	Reserved      int64
	Charged       int64
	Released      int64
	ModelMicros   int64
	WebMicros     int64
	ComputeMicros int64
	Output        *string
	ErrorMessage  string
	Request       json.RawMessage
	ZeroRetention bool
	Purged        bool
}

func runFromStore(r store.Run) runView {
	return runView{ID: r.ID, Status: r.Status, Model: r.Model, CreatedAt: r.CreatedAt, Reserved: r.Reserved,
		Charged: r.Charged, Released: r.Released, ModelMicros: r.Cost.Model, WebMicros: r.Cost.Web,
		ComputeMicros: r.Cost.Compute, Output: r.Output, ErrorMessage: r.ErrorMessage, Request: r.Request,
		ZeroRetention: r.ZeroRetention, Purged: r.PurgedAt != nil}
}

// runFromAPI reads a run object as the API returns it (GET /v1/runs/{id}).
func runFromAPI(raw json.RawMessage) (runView, error) {
	var r struct {
		ID                string       `json:"id"`
		Status            store.Status `json:"status"`
		Model             string       `json:"model"`
		CreatedAt         time.Time    `json:"created_at"`
		ZeroDataRetention bool         `json:"zero_data_retention"`
		Cost              struct {
			Reserved int64 `json:"reserved_micros"`
			Charged  int64 `json:"charged_micros"`
			Released int64 `json:"released_micros"`
			Model    int64 `json:"model_micros"`
			Web      int64 `json:"web_micros"`
			Compute  int64 `json:"compute_micros"`
		} `json:"cost"`
		Output *string `json:"output"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
		Request  json.RawMessage `json:"request"`
		PurgedAt *time.Time      `json:"purged_at"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return runView{}, fmt.Errorf("web: run object: %w", err)
	}
	v := runView{ID: r.ID, Status: r.Status, Model: r.Model, CreatedAt: r.CreatedAt, Reserved: r.Cost.Reserved,
		Charged: r.Cost.Charged, Released: r.Cost.Released, ModelMicros: r.Cost.Model, WebMicros: r.Cost.Web,
		ComputeMicros: r.Cost.Compute, Output: r.Output, Request: r.Request, ZeroRetention: r.ZeroDataRetention,
		Purged: r.PurgedAt != nil}
	if r.Error != nil {
		v.ErrorMessage = r.Error.Message
	}
	return v, nil
}

// eventView is one timeline entry as the API shapes it.
type eventView struct {
	ID       int64           `json:"id"`
	T        float64         `json:"t"`
	Category string          `json:"category"`
	Message  string          `json:"message"`
	Data     json.RawMessage `json:"data"`
}

func eventsFromStore(list []store.Event) []eventView {
	out := make([]eventView, len(list))
	for i, e := range list {
		out[i] = eventView{ID: e.Seq, T: float64(e.T.Milliseconds()) / 1000, Category: e.Category, Message: e.Message, Data: e.Data}
	}
	return out
}

// eventData is what rows read of an entry's data.
type eventData struct {
	State          timeline.State `json:"state"`
	ExitCode       *int           `json:"exit_code"`
	DurationMS     int64          `json:"duration_ms"`
	Stdout         string         `json:"stdout"`
	Stderr         string         `json:"stderr"`
	TimedOut       bool           `json:"timed_out"`
	Signal         int            `json:"signal"`
	Error          string         `json:"error"`
	ReservedMicros *int64         `json:"reserved_micros"`
	ModelCalls     *int64         `json:"model_calls"`
	Tokens         *int64         `json:"tokens"`
	ChargedMicros  *int64         `json:"charged_micros"`
	ReleasedMicros *int64         `json:"released_micros"`
}

// rowView is one row of a rendered timeline; the live timeline's script
// builds the same markup (static/js/timeline.js).
type rowView struct {
	ID       int64
	T        float64
	TText    string
	Class    string
	Category string
	Message  string
	Shell    bool
	Running  bool
	Failed   bool
	ExitText string
	Output   string
	// Ends is when the command ended, for playback: its result appears
	// then.
	Ends float64
}

// terminalCategories end a run's timeline; the answer belongs to them.
var terminalCategories = map[string]bool{
	timeline.Successful: true, timeline.Failed: true, timeline.TimedOut: true,
	timeline.BudgetExceeded: true, timeline.Canceled: true,
}

func categoryClass(c string) string { return strings.ReplaceAll(strings.ToLower(c), " ", "-") }

func seconds(s float64) string { return strconv.FormatFloat(s, 'f', 2, 64) }

// rows renders the timeline in l. The system's own messages are worded in
// l from their data (amounts, counts); user content is shown as it is.
func (l lang) rows(events []eventView) []rowView {
	out := make([]rowView, 0, len(events))
	for _, e := range events {
		var d eventData
		json.Unmarshal(e.Data, &d) // absent or odd data leaves the message as written
		r := rowView{ID: e.ID, T: e.T, TText: seconds(e.T), Class: categoryClass(e.Category),
			Category: l.T("cat." + e.Category), Message: e.Message}
		switch {
		case e.Category == timeline.Queued && d.ReservedMicros != nil:
			r.Message = l.T("msg.reserved", money.Format(*d.ReservedMicros))
		case e.Category == timeline.Successful && d.ModelCalls != nil && d.Tokens != nil:
			r.Message = l.T("msg.summary", money.Count(*d.ModelCalls), money.Count(*d.Tokens))
		case e.Category == timeline.WorkerDestroyed && d.ChargedMicros != nil && d.ReleasedMicros != nil:
			r.Message = l.T("msg.settled", money.Format(*d.ChargedMicros), money.Format(*d.ReleasedMicros))
		case e.Category == timeline.Shell:
			r.Shell = true
			r.Ends = e.T
			if d.State == timeline.Running || d.ExitCode == nil {
				r.Running = d.State == timeline.Running
				break
			}
			took := seconds(float64(d.DurationMS) / 1000)
			r.Ends = e.T + float64(d.DurationMS)/1000
			switch {
			case d.TimedOut:
				r.ExitText, r.Failed = l.T("exit.timedout", took), true
			case d.Signal != 0:
				r.ExitText, r.Failed = l.T("exit.signal", d.Signal, took), true
			default:
				r.ExitText, r.Failed = l.T("exit.code", *d.ExitCode, took), *d.ExitCode != 0
			}
			r.Output = strings.TrimRight(d.Stdout+d.Stderr+d.Error, "\n")
		}
		out = append(out, r)
	}
	return out
}

// requestView is what pages read of a run request.
type requestView struct {
	Prompt      string `json:"prompt"`
	Model       string `json:"model"`
	Shell       bool   `json:"shell"`
	Web         bool   `json:"web"`
	Connections []struct {
		Name    string   `json:"name"`
		Methods []string `json:"methods"`
	} `json:"connections"`
	Files []struct {
		Path    string `json:"path"`
		Content string `json:"content"`
	} `json:"files"`
	TimeoutSeconds    int64  `json:"timeout_seconds"`
	MaxCostMicros     int64  `json:"max_cost_micros"`
	ZeroDataRetention bool   `json:"zero_data_retention"`
	Replay            string `json:"replay"`
}

func parseRequest(raw json.RawMessage) (requestView, bool) {
	var r requestView
	if len(raw) == 0 || json.Unmarshal(raw, &r) != nil {
		return requestView{}, false
	}
	if r.TimeoutSeconds == 0 {
		r.TimeoutSeconds = 120
	}
	return r, true
}

// tags are the badges under a run's title.
func (l lang) tags(req requestView) []string {
	var t []string
	if req.Shell {
		t = append(t, l.T("tag.shell"))
	}
	if req.Web {
		t = append(t, l.T("tag.web"))
	}
	if len(req.Connections) > 0 {
		t = append(t, l.T("tag.connections"))
	}
	t = append(t, l.T("tag.budget"))
	if req.Replay != "" {
		t = append(t, l.T("tag.replay"))
	}
	return t
}

type permissionRow struct{ Setting, Allowed string }

// permissions is the table of what the request grants.
func (l lang) permissions(req requestView, retention time.Duration) []permissionRow {
	conns := l.T("perm.none")
	if len(req.Connections) > 0 {
		var parts []string
		for _, c := range req.Connections {
			parts = append(parts, c.Name+" ("+strings.Join(c.Methods, ", ")+")")
		}
		conns = strings.Join(parts, "; ")
	}
	web := l.T("perm.off")
	if req.Web {
		web = l.T("perm.web.on")
	}
	shell := l.T("perm.off")
	if req.Shell {
		shell = l.T("perm.shell.on")
	}
	files := l.T("perm.none")
	if len(req.Files) > 0 {
		var names []string
		for _, f := range req.Files {
			names = append(names, f.Path)
		}
		files = l.T("perm.files.v", len(req.Files), strings.Join(names, ", "))
	}
	zdr := l.T("perm.zdr.off", int(retention.Hours()/24))
	if req.ZeroDataRetention {
		zdr = l.T("perm.zdr.on")
	}
	return []permissionRow{
		{l.T("perm.connections"), conns},
		{l.T("perm.web"), web},
		{l.T("perm.shell"), shell},
		{l.T("perm.files"), files},
		{l.T("perm.zdr"), zdr},
		{l.T("perm.budget"), l.T("perm.budget.v", money.Format(req.MaxCostMicros))},
		{l.T("perm.timeout"), l.T("perm.timeout.v", req.TimeoutSeconds)},
	}
}

// curlCommand is the product page's curl line.
const curlCommand = `curl -X POST $EPHEMERAL_URL/v1/runs \
  -H "Authorization: Bearer $EPHEMERAL_API_KEY" \
  -H "Content-Type: application/json" \
  -H "Idempotency-Key: $(uuidgen)" \
  -d @request.json`

// prettyJSON indents a JSON document, keeping its member order.
func prettyJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

var monthsDE = []string{"Jan.", "Feb.", "März", "Apr.", "Mai", "Juni", "Juli", "Aug.", "Sept.", "Okt.", "Nov.", "Dez."}

// date is a day as the product page writes it: "Oct 7, 2026", "7. Okt. 2026".
func (l lang) date(t time.Time) string {
	t = t.UTC()
	if l.Code == "de" {
		return fmt.Sprintf("%d. %s %d", t.Day(), monthsDE[t.Month()-1], t.Year())
	}
	return t.Format("Jan 2, 2006")
}

// dateTime adds the time of day (UTC).
func (l lang) dateTime(t time.Time) string {
	return l.date(t) + " " + t.UTC().Format("15:04") + " UTC"
}

// replayView is a run in the product page's layout.
type replayView struct {
	L    lang
	Kind string // "example", "published" or "own"

	Title, Summary, HowItWorks string
	Tags                       []string
	WatchHeading, Intro        string

	Run        runView
	StatusText string
	SpentText  string
	Purged     bool
	Events     []rowView
	Playback   bool
	Autoplay   bool
	Live       bool
	// AnswerT is when the answer appears during playback: with the row
	// that ends the run.
	AnswerT     float64
	Answer      template.HTML
	AnswerLabel string
	ErrorText   string

	Budget        int64
	PlaygroundURL string
	SignedIn      bool

	Permissions []permissionRow
	Curl        string
	RequestJSON string

	// Own runs.
	Own         bool
	PublicURL   string
	CanPublish  bool
	PublishHint string
	CanDelete   bool
}

// newReplayView fills what every kind of run page shows.
func newReplayView(l lang, kind string, run runView, events []eventView, requestDoc json.RawMessage, retention time.Duration) *replayView {
	v := &replayView{L: l, Kind: kind, Run: run, Purged: run.Purged,
		StatusText: l.T("status." + string(run.Status)),
		SpentText:  l.T("spent", money.Format(run.Charged), money.Format(run.Reserved)),
		Events:     l.rows(events), Live: !run.Status.Terminal(), Budget: run.Reserved}
	v.Playback = !v.Live && len(v.Events) > 0
	for _, e := range events {
		if terminalCategories[e.Category] {
			v.AnswerT = e.T
		}
	}
	if run.Output != nil {
		v.Answer = renderMarkdown(*run.Output)
	} else if run.ErrorMessage != "" && run.Status != store.Succeeded {
		v.ErrorText = run.ErrorMessage
	}
	if requestDoc == nil {
		requestDoc = run.Request
	}
	if req, ok := parseRequest(requestDoc); ok {
		v.Tags = l.tags(req)
		v.Permissions = l.permissions(req, retention)
		v.Curl = curlCommand
		v.RequestJSON = prettyJSON(requestDoc)
		if req.MaxCostMicros > 0 {
			v.Budget = req.MaxCostMicros
		}
	}
	return v
}
