package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// The statuses of a run; it ends in exactly one of the last five.
const (
	Queued         = "queued"
	Running        = "running"
	Succeeded      = "succeeded"
	Failed         = "failed"
	TimedOut       = "timed_out"
	BudgetExceeded = "budget_exceeded"
	Canceled       = "canceled"
)

// Terminal reports whether a run in status has ended.
func Terminal(status string) bool { return status != Queued && status != Running }

// Run is the API's run object. Raw is the object as the API sent it, for
// callers that pass it on.
type Run struct {
	ID                 string          `json:"id"`
	Status             string          `json:"status"`
	Model              string          `json:"model"`
	TimeoutSeconds     int             `json:"timeout_seconds"`
	ZeroDataRetention  bool            `json:"zero_data_retention"`
	CreatedAt          time.Time       `json:"created_at"`
	StartedAt          *time.Time      `json:"started_at"`
	FinishedAt         *time.Time      `json:"finished_at"`
	Usage              Usage           `json:"usage"`
	Cost               Cost            `json:"cost"`
	Output             *string         `json:"output"`
	Error              *RunError       `json:"error"`
	Request            json.RawMessage `json:"request"`
	RetentionExpiresAt *time.Time      `json:"retention_expires_at"`
	PurgedAt           *time.Time      `json:"purged_at"`
	Raw                json.RawMessage `json:"-"`
}

// Usage is what a run used.
type Usage struct {
	ModelCalls    int64   `json:"model_calls"`
	InputTokens   int64   `json:"input_tokens"`
	OutputTokens  int64   `json:"output_tokens"`
	Tokens        int64   `json:"tokens"`
	ShellCommands int64   `json:"shell_commands"`
	WebRequests   int64   `json:"web_requests"`
	VMSeconds     float64 `json:"vm_seconds"`
}

// Cost is a run's money, in micro-dollars.
type Cost struct {
	Reserved int64 `json:"reserved_micros"`
	Charged  int64 `json:"charged_micros"`
	Released int64 `json:"released_micros"`
	Model    int64 `json:"model_micros"`
	Web      int64 `json:"web_micros"`
	Compute  int64 `json:"compute_micros"`
}

// RunError says why a run did not succeed.
type RunError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// RunList is a page of runs, newest first.
type RunList struct {
	Data       []Run   `json:"data"`
	HasMore    bool    `json:"has_more"`
	NextCursor *string `json:"next_cursor"`
}

// Event is one timeline entry. ID is its place on the timeline; Rev the
// run's revision that last wrote it: an entry amended later (a shell
// command's, when the command ends) comes again with the same ID and a
// higher Rev, and replaces the one before. Raw is the entry as the API
// sent it.
type Event struct {
	ID       int64           `json:"id"`
	Rev      int64           `json:"rev"`
	T        float64         `json:"t"` // seconds since the run was queued
	Category string          `json:"category"`
	Message  string          `json:"message"`
	Data     json.RawMessage `json:"data"`
	Raw      json.RawMessage `json:"-"`
}

// EventList is a page of a run's timeline, in timeline order, each entry
// with its latest data.
type EventList struct {
	RunStatus string  `json:"run_status"`
	Data      []Event `json:"data"`
	HasMore   bool    `json:"has_more"`
}

// Balance is the organisation's money, in micro-dollars.
type Balance struct {
	Available int64           `json:"available_micros"`
	Held      int64           `json:"held_micros"`
	Charged   int64           `json:"charged_micros"`
	Credited  int64           `json:"credited_micros"`
	Raw       json.RawMessage `json:"-"`
}

// CreateRun sends body, a run request (request.json), as POST /v1/runs
// with idempotencyKey: sending it again with the same key (after a lost
// answer or a 429) returns the same run, never a second one. created is
// false when the API returned the run an earlier request with the key made.
func (c *Client) CreateRun(ctx context.Context, body []byte, idempotencyKey string) (run Run, created bool, err error) {
	req := request{method: http.MethodPost, path: "/v1/runs", body: body, header: http.Header{}}
	if idempotencyKey != "" {
		req.header.Set("Idempotency-Key", idempotencyKey)
		req.repeatable = true
	}
	status, raw, err := c.do(ctx, req)
	if err != nil {
		return Run{}, false, err
	}
	run, err = decodeRun(raw, "create run")
	return run, status == http.StatusCreated, err
}

// GetRun fetches a run.
func (c *Client) GetRun(ctx context.Context, id string) (Run, error) {
	_, raw, err := c.do(ctx, request{method: http.MethodGet, path: runPath(id, ""), repeatable: true})
	if err != nil {
		return Run{}, err
	}
	return decodeRun(raw, "get run")
}

// ListParams select a page of runs; zero values are the API's defaults.
type ListParams struct {
	Status        string // only runs in this status
	Limit         int    // 1 to 100; default 20
	StartingAfter string // the last run id of the previous page
}

// ListRuns fetches a page of the organisation's runs, newest first. Raw is
// the page as the API sent it.
func (c *Client) ListRuns(ctx context.Context, p ListParams) (RunList, json.RawMessage, error) {
	q := url.Values{}
	if p.Status != "" {
		q.Set("status", p.Status)
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.StartingAfter != "" {
		q.Set("starting_after", p.StartingAfter)
	}
	_, raw, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/runs", query: q, repeatable: true})
	if err != nil {
		return RunList{}, nil, err
	}
	var page struct {
		RunList
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &page); err != nil {
		return RunList{}, nil, fmt.Errorf("list runs: the answer is not a list of runs: %w", err)
	}
	list := page.RunList
	for _, r := range page.Data {
		run, err := decodeRun(r, "list runs")
		if err != nil {
			return RunList{}, nil, err
		}
		list.Data = append(list.Data, run)
	}
	return list, raw, nil
}

// Events fetches a page of the run's timeline: the entries after the
// entry with ID after (0: from the start).
func (c *Client) Events(ctx context.Context, id string, after int64) (EventList, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	_, raw, err := c.do(ctx, request{method: http.MethodGet, path: runPath(id, "/events"), query: q, repeatable: true})
	if err != nil {
		return EventList{}, err
	}
	var page struct {
		EventList
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &page); err != nil {
		return EventList{}, fmt.Errorf("events of %s: the answer is not a list of events: %w", id, err)
	}
	list := page.EventList
	for _, r := range page.Data {
		ev, err := decodeEvent(r)
		if err != nil {
			return EventList{}, fmt.Errorf("events of %s: %w", id, err)
		}
		list.Data = append(list.Data, ev)
	}
	return list, nil
}

// CancelRun stops a run; a run that has ended is returned unchanged.
func (c *Client) CancelRun(ctx context.Context, id string) (Run, error) {
	_, raw, err := c.do(ctx, request{method: http.MethodPost, path: runPath(id, "/cancel"), repeatable: true})
	if err != nil {
		return Run{}, err
	}
	return decodeRun(raw, "cancel run")
}

// DeleteRun purges a finished run's content (prompt, timeline, output,
// recording); what it cost is kept.
func (c *Client) DeleteRun(ctx context.Context, id string) (Run, error) {
	_, raw, err := c.do(ctx, request{method: http.MethodDelete, path: runPath(id, ""), repeatable: true})
	if err != nil {
		return Run{}, err
	}
	return decodeRun(raw, "delete run")
}

// Recording fetches the run's recording of its model turns: the document
// ephemeral run --replay reads.
func (c *Client) Recording(ctx context.Context, id string) ([]byte, error) {
	_, raw, err := c.do(ctx, request{method: http.MethodGet, path: runPath(id, "/recording"), repeatable: true})
	if err != nil {
		return nil, err
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("recording of %s: the answer is not JSON", id)
	}
	return raw, nil
}

// Balance fetches the organisation's balance.
func (c *Client) Balance(ctx context.Context) (Balance, error) {
	_, raw, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/balance", repeatable: true})
	if err != nil {
		return Balance{}, err
	}
	var b Balance
	if err := json.Unmarshal(raw, &b); err != nil {
		return Balance{}, fmt.Errorf("balance: the answer is not a balance: %w", err)
	}
	b.Raw = raw
	return b, nil
}

// runPath is a run's URL path; the id is escaped, so whatever a user
// types stays one path segment.
func runPath(id, suffix string) string {
	return "/v1/runs/" + url.PathEscape(id) + suffix
}

func decodeRun(raw []byte, op string) (Run, error) {
	var r Run
	if err := json.Unmarshal(raw, &r); err != nil {
		return Run{}, fmt.Errorf("%s: the answer is not a run: %w", op, err)
	}
	if r.ID == "" || r.Status == "" {
		return Run{}, fmt.Errorf("%s: the answer is not a run: %.100s", op, raw)
	}
	r.Raw = json.RawMessage(raw)
	return r, nil
}

func decodeEvent(raw []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(raw, &e); err != nil {
		return Event{}, fmt.Errorf("an event is not JSON: %w", err)
	}
	if e.ID < 1 || e.Rev < 1 {
		return Event{}, fmt.Errorf("an event has no id or rev: %.100s", raw)
	}
	e.Raw = json.RawMessage(raw)
	return e, nil
}
