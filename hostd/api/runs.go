package api

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// runJSON is the run object.
type runJSON struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	Status             store.Status    `json:"status"`
	Model              string          `json:"model"`
	TimeoutSeconds     int             `json:"timeout_seconds"`
	ZeroDataRetention  bool            `json:"zero_data_retention"`
	CreatedAt          time.Time       `json:"created_at"`
	StartedAt          *time.Time      `json:"started_at"`
	FinishedAt         *time.Time      `json:"finished_at"`
	Usage              usageJSON       `json:"usage"`
	Cost               costJSON        `json:"cost"`
	Output             *string         `json:"output"`
	Error              *runErrorJSON   `json:"error"`
	Request            json.RawMessage `json:"request"`
	RetentionExpiresAt *time.Time      `json:"retention_expires_at"`
	PurgedAt           *time.Time      `json:"purged_at"`
	// Outputs are the files the run kept (none until it ends, none once
	// purged; under zero data retention each is listed until downloaded).
	Outputs []outputJSON `json:"outputs"`
}

// outputJSON describes one output file of a run.
type outputJSON struct {
	Path        string `json:"path"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
	ContentType string `json:"content_type"`
	DownloadURL string `json:"download_url"`
}

// outputURL is where an output is downloaded, each path element escaped.
func outputURL(runID, path string) string {
	elems := strings.Split(path, "/")
	for i, e := range elems {
		elems[i] = url.PathEscape(e)
	}
	return "/v1/runs/" + runID + "/outputs/" + strings.Join(elems, "/")
}

type usageJSON struct {
	ModelCalls    int64   `json:"model_calls"`
	InputTokens   int64   `json:"input_tokens"`
	OutputTokens  int64   `json:"output_tokens"`
	Tokens        int64   `json:"tokens"`
	ShellCommands int64   `json:"shell_commands"`
	WebRequests   int64   `json:"web_requests"`
	VMSeconds     float64 `json:"vm_seconds"`
}

type costJSON struct {
	Reserved int64 `json:"reserved_micros"`
	Charged  int64 `json:"charged_micros"`
	Released int64 `json:"released_micros"`
	Model    int64 `json:"model_micros"`
	Web      int64 `json:"web_micros"`
	Compute  int64 `json:"compute_micros"`
}

type runErrorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (s *Server) runJSON(r store.Run) runJSON {
	out := runJSON{
		ID: r.ID, Object: "run", Status: r.Status, Model: r.Model, TimeoutSeconds: r.TimeoutSeconds,
		ZeroDataRetention: r.ZeroRetention, CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		Usage: usageJSON{ModelCalls: r.Usage.ModelCalls, InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens,
			Tokens: r.Usage.Tokens(), ShellCommands: r.Usage.ShellCommands, WebRequests: r.Usage.WebRequests,
			VMSeconds: r.Usage.VMTime.Seconds()},
		Cost: costJSON{Reserved: r.Reserved, Charged: r.Charged, Released: r.Released,
			Model: r.Cost.Model, Web: r.Cost.Web, Compute: r.Cost.Compute},
		Output: r.Output, Request: r.Request, RetentionExpiresAt: r.RetentionUntil, PurgedAt: r.PurgedAt,
		Outputs: []outputJSON{},
	}
	if r.ZeroRetention && r.Status == store.Succeeded && r.PurgedAt == nil {
		if o, ok := s.runs.VolatileOutput(r.ID); ok {
			out.Output = &o
		}
	}
	if r.ErrorCode != "" {
		out.Error = &runErrorJSON{Code: r.ErrorCode, Message: r.ErrorMessage}
	}
	return out
}

// runObjects are the runs as the API shows them, with their outputs: the
// stored ones read in one query, a zero-data-retention run's from memory.
func (s *Server) runObjects(ctx context.Context, list ...store.Run) ([]runJSON, error) {
	var stored []string
	for _, r := range list {
		if !r.ZeroRetention {
			stored = append(stored, r.ID)
		}
	}
	files, err := s.store.OutputsOf(ctx, stored)
	if err != nil {
		return nil, err
	}
	out := make([]runJSON, len(list))
	for i, r := range list {
		out[i] = s.runJSON(r)
		kept := files[r.ID]
		if r.ZeroRetention && r.PurgedAt == nil {
			kept = s.runs.VolatileFiles(r.ID)
		}
		for _, o := range kept {
			out[i].Outputs = append(out[i].Outputs, outputJSON{Path: o.Path, Size: o.Size, SHA256: hex.EncodeToString(o.SHA256),
				ContentType: o.ContentType, DownloadURL: outputURL(r.ID, o.Path)})
		}
	}
	return out, nil
}

// writeRun answers with one run object.
func (s *Server) writeRun(w http.ResponseWriter, r *http.Request, status int, run store.Run) {
	objects, err := s.runObjects(r.Context(), run)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, status, objects[0])
}

// RunObject is one of an organisation's runs encoded as GET /v1/runs/{id}
// answers it: what a webhook delivery carries.
func (s *Server) RunObject(ctx context.Context, orgID, runID string) ([]byte, error) {
	run, err := s.store.GetRun(ctx, orgID, runID)
	if err != nil {
		return nil, err
	}
	objects, err := s.runObjects(ctx, run)
	if err != nil {
		return nil, err
	}
	return json.Marshal(objects[0])
}

func (s *Server) createRun(w http.ResponseWriter, r *http.Request, orgID string) {
	if apiErr := requireJSON(r); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key != "" && !validIdempotencyKey(key) {
		writeError(w, &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: "parameter_invalid",
			Param: "Idempotency-Key", Message: "Idempotency-Key must be 1 to 255 printable ASCII characters"})
		return
	}
	var req runRequest
	if apiErr := decodeStrict(r, w, &req); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	canon, apiErr := req.validate(s.lim)
	if apiErr == nil && canon.Replay != "" {
		apiErr = s.checkReplay(&canon)
	}
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	if apiErr, err := s.checkBudget(canon.spec(orgID)); err != nil {
		s.internalError(w, r, err)
		return
	} else if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	apiErr, err := s.checkGrants(r.Context(), orgID, canon.Connections)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	if apiErr, err := s.checkWebhookSecret(r.Context(), orgID, canon.WebhookURL); err != nil {
		s.internalError(w, r, err)
		return
	} else if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	run, created, err := s.runs.Submit(r.Context(), runs.Submission{
		Spec: canon.spec(orgID), IdempotencyKey: key, Canonical: canon.encode()})
	switch {
	case errors.Is(err, store.ErrIdempotencyMismatch):
		writeError(w, &apiError{Status: http.StatusUnprocessableEntity, Type: idempotency, Code: "idempotency_key_reused",
			Param: "Idempotency-Key", Message: "this Idempotency-Key was used with a different request body"})
	case errors.Is(err, ledger.ErrInsufficientFunds):
		writeError(w, &apiError{Status: http.StatusPaymentRequired, Type: insufficient, Code: "insufficient_balance",
			Param: "max_cost_micros", Message: "the organisation's available balance cannot cover max_cost_micros"})
	case errors.Is(err, store.ErrTooManyActive):
		w.Header().Set("Retry-After", "5")
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: rateLimit, Code: "concurrency_limit",
			Message: "the organisation has its maximum number of queued and running runs; retry when one ends"})
	case err != nil:
		s.internalError(w, r, err)
	case created:
		w.Header().Set("Location", "/v1/runs/"+run.ID)
		s.writeRun(w, r, http.StatusCreated, run)
	default:
		w.Header().Set("Idempotent-Replayed", "true")
		s.writeRun(w, r, http.StatusOK, run)
	}
}

// checkBudget refuses a budget that cannot pay for the run's first model
// call (see agent.Executor.MinimumBudget for the formula), before anything
// is reserved or booted.
func (s *Server) checkBudget(spec runs.Spec) (*apiError, error) {
	if s.lim.minimumBudget == nil {
		return nil, nil
	}
	least, err := s.lim.minimumBudget(spec)
	if err != nil || spec.MaxCostMicros >= least {
		return nil, err
	}
	e := badParam("max_cost_micros", "budget_too_small", fmt.Sprintf("max_cost_micros %d (%s) cannot pay for this run's first model call: "+
		"it needs at least %d (%s): the prompt, the system prompt and the tools at %s's input price, the shortest answer at its output price, "+
		"and one VM-second of compute", spec.MaxCostMicros, money.Format(spec.MaxCostMicros), least, money.Format(least), spec.Model))
	e.MinimumMicros = least
	return e, nil
}

var runIDPattern = regexp.MustCompile(`^run_[0-9a-f]{32}$`)

// loadRun answers 404 for malformed ids, unknown runs and other
// organisations' runs alike.
func (s *Server) loadRun(w http.ResponseWriter, r *http.Request, orgID string) (store.Run, bool) {
	id := r.PathValue("id")
	if runIDPattern.MatchString(id) {
		run, err := s.store.GetRun(r.Context(), orgID, id)
		if err == nil {
			return run, true
		}
		if !errors.Is(err, store.ErrNotFound) {
			s.internalError(w, r, err)
			return store.Run{}, false
		}
	}
	writeNotFound(w)
	return store.Run{}, false
}

func writeNotFound(w http.ResponseWriter) {
	writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "run_not_found", Param: "id",
		Message: "no such run"})
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request, orgID string) {
	if run, ok := s.loadRun(w, r, orgID); ok {
		s.writeRun(w, r, http.StatusOK, run)
	}
}

// getRecording serves the run's model exchanges as the document that
// ephemeral run --replay reads.
func (s *Server) getRecording(w http.ResponseWriter, r *http.Request, orgID string) {
	run, ok := s.loadRun(w, r, orgID)
	if !ok {
		return
	}
	doc, err := s.runs.Recording(r.Context(), orgID, run.ID)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "recording_not_found", Param: "id",
			Message: "the run has no recording: it has made no model call yet, had zero data retention, or its content was purged"})
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(doc) // a failed write means the client left; nothing to tell it
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request, orgID string) {
	if _, ok := s.loadRun(w, r, orgID); !ok {
		return
	}
	run, err := s.runs.Cancel(r.Context(), orgID, r.PathValue("id"))
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	s.writeRun(w, r, http.StatusOK, run)
}

func (s *Server) deleteRun(w http.ResponseWriter, r *http.Request, orgID string) {
	if _, ok := s.loadRun(w, r, orgID); !ok {
		return
	}
	run, err := s.store.PurgeRun(r.Context(), orgID, r.PathValue("id"), time.Now())
	if errors.Is(err, store.ErrActive) {
		writeError(w, &apiError{Status: http.StatusConflict, Type: conflict, Code: "run_active", Param: "id",
			Message: "the run is still active; cancel it first"})
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	// Old WAL frames still hold the purged content until a checkpoint.
	if err := s.store.Checkpoint(r.Context()); err != nil {
		s.log.Warn("checkpoint after purge", "run", run.ID, "err", err)
	}
	s.writeRun(w, r, http.StatusOK, run)
}

const (
	defaultPageSize = 20
	maxPageSize     = 100
)

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request, orgID string) {
	q := r.URL.Query()
	limit := defaultPageSize
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			writeError(w, badParam("limit", "parameter_out_of_range", "limit must be an integer between 1 and 100"))
			return
		}
		limit = n
	}
	after := q.Get("starting_after")
	if after != "" && !runIDPattern.MatchString(after) {
		writeError(w, badParam("starting_after", "parameter_invalid", "starting_after must be a run id"))
		return
	}
	status := store.Status(q.Get("status"))
	if status != "" && !slices.Contains(store.Statuses, status) {
		writeError(w, badParam("status", "parameter_invalid", fmt.Sprintf("status must be one of %s", statusNames())))
		return
	}
	list, more, err := s.store.ListRunsWithStatus(r.Context(), orgID, status, after, limit)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, badParam("starting_after", "parameter_invalid", "starting_after names no run of this organisation"))
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	page := struct {
		Object     string    `json:"object"`
		Data       []runJSON `json:"data"`
		HasMore    bool      `json:"has_more"`
		NextCursor *string   `json:"next_cursor"`
	}{Object: "list", Data: []runJSON{}, HasMore: more}
	if page.Data, err = s.runObjects(r.Context(), list...); err != nil {
		s.internalError(w, r, err)
		return
	}
	if more {
		page.NextCursor = &list[len(list)-1].ID
	}
	writeJSON(w, http.StatusOK, page)
}

// statusNames lists the statuses a run can have, for error messages.
func statusNames() string {
	names := make([]string, len(store.Statuses))
	for i, st := range store.Statuses {
		names[i] = string(st)
	}
	return strings.Join(names, ", ")
}

func (s *Server) balance(w http.ResponseWriter, r *http.Request, orgID string) {
	a, err := s.store.Balance(r.Context(), orgID)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Object string `json:"object"`
		ledger.Account
	}{"balance", a})
}
