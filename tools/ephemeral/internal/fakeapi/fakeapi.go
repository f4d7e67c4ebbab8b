// Package fakeapi stands in for the daemon's runs API in tests of its
// clients: it speaks the API's wire format (bearer keys, the JSON error
// shape, pages of runs, the timeline as JSON pages and as Server-Sent
// Events with amended entries, 204 after the end, 429 with Retry-After)
// for scripted runs whose timelines are complete, and cuts event streams
// where a test says, cleanly or in the middle of an entry.
package fakeapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Entry is one revision of a timeline: an entry appended, or amended
// (the ID of an earlier one).
type Entry struct {
	ID       int64          `json:"id"`
	Rev      int64          `json:"rev"`
	T        float64        `json:"t"`
	Category string         `json:"category"`
	Message  string         `json:"message"`
	Data     map[string]any `json:"data"`
}

// Run is a scripted run: the object GET returns and its timeline, every
// revision in order. The run has ended in Object["status"].
type Run struct {
	Object    map[string]any
	Timeline  []Entry
	Recording string
}

func (r *Run) id() string     { return r.Object["id"].(string) }
func (r *Run) status() string { return r.Object["status"].(string) }

// Cut ends one event-stream connection early: after After timeline
// messages, either at a message boundary or, with Partial, after the first
// half of the next message; the connection is then reset.
type Cut struct {
	After   int
	Partial bool
}

// Request is what the server saw of one request.
type Request struct {
	Method, Path, Query          string
	LastEventID, IdempotencyKey  string
	Authorization, Accept, Agent string
	Body                         string
}

// Server is the fake API. Set its fields before serving.
type Server struct {
	Key string // the one valid API key
	// NewRun scripts the run POST /v1/runs creates from a request body.
	NewRun func(id string, body map[string]any) *Run
	// Cuts applies to event-stream connections in order: the first
	// connection gets Cuts[0], and so on; later ones are not cut.
	Cuts []Cut
	// EventsPage is the size of a JSON page of events (default 500).
	EventsPage int
	// RepeatOnReconnect makes a resumed stream send again the entry at
	// Last-Event-ID, as a faulty proxy might.
	RepeatOnReconnect bool
	Balance           map[string]any

	mu          sync.Mutex
	runs        []*Run // newest last
	byKey       map[string]*Run
	requests    []Request
	streams     int
	throttle    int
	retryAfter  string
	nextRunSeed int
}

// New returns a server that accepts key.
func New(key string) *Server {
	return &Server{Key: key, byKey: map[string]*Run{},
		Balance: map[string]any{"object": "balance", "available_micros": 4996470, "held_micros": 0, "charged_micros": 3530, "credited_micros": 5000000}}
}

// AddRun stores a run, as the newest.
func (s *Server) AddRun(r *Run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs = append(s.runs, r)
}

// Throttle answers the next n requests with 429 and Retry-After.
func (s *Server) Throttle(n int, retryAfter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttle, s.retryAfter = n, retryAfter
}

// Requests is every request so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		LastEventID: r.Header.Get("Last-Event-ID"), IdempotencyKey: r.Header.Get("Idempotency-Key"),
		Authorization: r.Header.Get("Authorization"), Accept: r.Header.Get("Accept"), Agent: r.Header.Get("User-Agent"), Body: string(body)})
	throttled := s.throttle > 0
	if throttled {
		s.throttle--
		w.Header().Set("Retry-After", s.retryAfter)
	}
	s.mu.Unlock()
	switch {
	case throttled:
		writeError(w, http.StatusTooManyRequests, "rate_limit_error", "rate_limited", "", "too many requests from this API key; retry after Retry-After seconds")
		return
	case r.Header.Get("Authorization") != "Bearer "+s.Key:
		writeError(w, http.StatusUnauthorized, "authentication_error", "invalid_api_key", "", "send a valid API key as Authorization: Bearer eph_...")
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/v1/")
	switch {
	case r.Method == "POST" && path == "runs":
		s.create(w, r, string(body))
	case r.Method == "GET" && path == "runs":
		s.list(w, r)
	case r.Method == "GET" && path == "balance":
		writeJSON(w, http.StatusOK, s.Balance)
	case strings.HasPrefix(path, "runs/"):
		id, rest, _ := strings.Cut(strings.TrimPrefix(path, "runs/"), "/")
		run := s.run(id)
		if run == nil {
			writeError(w, http.StatusNotFound, "invalid_request_error", "run_not_found", "id", "no such run")
			return
		}
		switch {
		case r.Method == "GET" && rest == "":
			writeJSON(w, http.StatusOK, run.Object)
		case r.Method == "GET" && rest == "events" && strings.Contains(r.Header.Get("Accept"), "text/event-stream"):
			s.stream(w, r, run)
		case r.Method == "GET" && rest == "events":
			s.events(w, r, run)
		case r.Method == "GET" && rest == "recording":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(run.Recording))
		case r.Method == "POST" && rest == "cancel":
			writeJSON(w, http.StatusOK, run.Object)
		case r.Method == "DELETE" && rest == "":
			s.mu.Lock()
			run.Object["purged_at"] = time.Now().UTC().Format(time.RFC3339)
			run.Timeline, run.Recording = nil, ""
			s.mu.Unlock()
			writeJSON(w, http.StatusOK, run.Object)
		default:
			writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "", "no such endpoint: "+r.Method+" "+r.URL.Path)
		}
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "", "no such endpoint: "+r.Method+" "+r.URL.Path)
	}
}

func (s *Server) run(id string) *Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs {
		if r.id() == id {
			return r
		}
	}
	return nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, body string) {
	var req map[string]any
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "request body is not valid JSON: "+err.Error())
		return
	}
	for _, field := range []string{"prompt", "max_cost_micros"} {
		if _, ok := req[field]; !ok {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_missing", field, field+" is required")
			return
		}
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	if earlier, ok := s.byKey[key]; ok && key != "" {
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, earlier.Object)
		return
	}
	s.nextRunSeed++
	id := fmt.Sprintf("run_%032x", s.nextRunSeed)
	s.mu.Unlock()
	run := s.NewRun(id, req)
	s.mu.Lock()
	s.runs = append(s.runs, run)
	if key != "" {
		s.byKey[key] = run
	}
	s.mu.Unlock()
	// The run as created: queued, before its timeline.
	created := map[string]any{}
	for k, v := range run.Object {
		created[k] = v
	}
	created["status"] = "queued"
	writeJSON(w, http.StatusCreated, created)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_out_of_range", "limit", "limit must be an integer between 1 and 100")
			return
		}
		limit = n
	}
	s.mu.Lock()
	var newestFirst []*Run
	for i := len(s.runs) - 1; i >= 0; i-- {
		newestFirst = append(newestFirst, s.runs[i])
	}
	s.mu.Unlock()
	if after := q.Get("starting_after"); after != "" {
		i := slices.IndexFunc(newestFirst, func(r *Run) bool { return r.id() == after })
		if i < 0 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid", "starting_after", "starting_after names no run of this organisation")
			return
		}
		newestFirst = newestFirst[i+1:]
	}
	page := map[string]any{"object": "list", "data": []any{}, "has_more": false, "next_cursor": nil}
	var data []any
	for _, run := range newestFirst {
		if st := q.Get("status"); st != "" && run.status() != st {
			continue
		}
		if len(data) == limit {
			page["has_more"], page["next_cursor"] = true, data[len(data)-1].(map[string]any)["id"]
			break
		}
		data = append(data, run.Object)
	}
	if data != nil {
		page["data"] = data
	}
	writeJSON(w, http.StatusOK, page)
}

// latest is each entry once, in timeline order, with its latest revision.
func latest(timeline []Entry) []Entry {
	byID := map[int64]Entry{}
	for _, e := range timeline {
		byID[e.ID] = e
	}
	var out []Entry
	for _, e := range byID {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return int(a.ID - b.ID) })
	return out
}

func (s *Server) events(w http.ResponseWriter, r *http.Request, run *Run) {
	after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	size := s.EventsPage
	if size == 0 {
		size = 500
	}
	var rest []Entry
	for _, e := range latest(run.Timeline) {
		if e.ID > after {
			rest = append(rest, e)
		}
	}
	page := map[string]any{"object": "list", "run_status": run.status(), "data": rest[:min(len(rest), size)], "has_more": len(rest) > size}
	if len(rest) == 0 {
		page["data"] = []any{}
	}
	writeJSON(w, http.StatusOK, page)
}

// stream sends the timeline after Last-Event-ID as the API does, then the
// end event, unless this connection is to be cut.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, run *Run) {
	after, _ := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64)
	s.mu.Lock()
	var cut *Cut
	if s.streams < len(s.Cuts) {
		cut = &s.Cuts[s.streams]
	}
	s.streams++
	repeat := s.RepeatOnReconnect
	s.mu.Unlock()
	var rest []Entry
	for _, e := range run.Timeline {
		if e.Rev > after || repeat && after > 0 && e.Rev == after {
			rest = append(rest, e)
		}
	}
	if after > 0 && len(rest) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	fmt.Fprint(w, ": keep-alive\r\n\r\n")
	for i, e := range rest {
		b, _ := json.Marshal(e)
		msg := fmt.Sprintf("id: %d\nevent: timeline\ndata: %s\n\n", e.Rev, b)
		if cut != nil && i == cut.After {
			if cut.Partial {
				fmt.Fprint(w, msg[:len(msg)/2])
			}
			flusher.Flush()
			panic(http.ErrAbortHandler) // resets the connection
		}
		fmt.Fprint(w, msg)
		flusher.Flush()
	}
	if cut != nil && cut.After >= len(rest) {
		flusher.Flush()
		panic(http.ErrAbortHandler) // every entry sent, but not the end
	}
	fmt.Fprintf(w, "event: end\ndata: {\"status\":%q}\n\n", run.status())
	flusher.Flush()
}

func writeError(w http.ResponseWriter, status int, typ, code, param, message string) {
	e := map[string]string{"type": typ, "code": code, "message": message}
	if param != "" {
		e["param"] = param
	}
	writeJSON(w, status, map[string]any{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// PageRun is the product page's run as the API tells it: the request
// shell on, web off, $0.04; two pairs of parallel shell commands, each
// entry amended with its result when its command ends (the second of a
// pair first), then the outcome. It succeeded.
func PageRun(id string) *Run {
	running := func(cmd string) map[string]any { return map[string]any{"command": cmd, "state": "running"} }
	done := func(cmd, stdout string, code int, ms int) map[string]any {
		return map[string]any{"command": cmd, "state": "done", "stdout": stdout, "exit_code": code, "duration_ms": ms}
	}
	curlOut := "/usr/bin/curl\ncurl: (6) Could not resolve host: example.com\n"
	timeline := []Entry{
		{ID: 1, T: 0, Category: "Queued", Message: "Budget $0.04 reserved", Data: map[string]any{}},
		{ID: 2, T: 2.42, Category: "MicroVM", Message: "microVM ready", Data: map[string]any{}},
		{ID: 3, T: 2.47, Category: "MicroVM", Message: "worker started · shell on · web off", Data: map[string]any{}},
		{ID: 4, T: 5.25, Category: "Shell", Message: "$ pwd; whoami", Data: running("pwd; whoami")},
		{ID: 5, T: 5.25, Category: "Shell", Message: "$ command -v curl && curl -sS -m 8 https://example.com", Data: running("curl")},
		{ID: 4, T: 5.25, Category: "Shell", Message: "$ pwd; whoami", Data: done("pwd; whoami", "/tmp/ephemeral-run-d4hLHG/scratch\nworker\n", 0, 230)},
		{ID: 5, T: 5.25, Category: "Shell", Message: "$ command -v curl && curl -sS -m 8 https://example.com", Data: done("curl", curlOut, 6, 410)},
		{ID: 6, T: 10.33, Category: "Shell", Message: "$ python3 primes.py", Data: running("python3 primes.py")},
		{ID: 7, T: 10.33, Category: "Shell", Message: "$ ls -l /tmp/proof.txt", Data: running("ls")},
		{ID: 7, T: 10.33, Category: "Shell", Message: "$ ls -l /tmp/proof.txt", Data: done("ls", "-rw-r--r-- 1 worker worker 14 Dec  1 03:05 /tmp/proof.txt\n", 0, 20)},
		{ID: 6, T: 10.33, Category: "Shell", Message: "$ python3 primes.py", Data: done("python3 primes.py", "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\n", 0, 90)},
		{ID: 8, T: 15.83, Category: "MicroVM", Message: "microVM destroyed", Data: map[string]any{}},
		{ID: 9, T: 15.84, Category: "Successful", Message: "3 model calls, 5,214 tokens", Data: map[string]any{}},
		{ID: 10, T: 16.24, Category: "Worker destroyed", Message: "$0.00353 charged, $0.03647 released", Data: map[string]any{}},
	}
	for i := range timeline {
		timeline[i].Rev = int64(i + 1)
	}
	output := "1. Prime script output: 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47\nThe network call did not succeed."
	return &Run{
		Object: map[string]any{
			"id": id, "object": "run", "status": "succeeded", "model": "openai/gpt-6-luna", "timeout_seconds": 120,
			"zero_data_retention": false, "created_at": "2026-12-01T03:05:00Z", "started_at": "2026-12-01T03:05:01Z",
			"finished_at": "2026-12-01T03:05:16Z",
			"usage": map[string]any{"model_calls": 3, "input_tokens": 4800, "output_tokens": 414, "tokens": 5214,
				"shell_commands": 4, "web_requests": 0, "vm_seconds": 13.333},
			"cost": map[string]any{"reserved_micros": 40000, "charged_micros": 3530, "released_micros": 36470,
				"model_micros": 330, "web_micros": 0, "compute_micros": 3200},
			"output": output, "error": nil, "request": map[string]any{"prompt": "This is a sandbox test.", "max_cost_micros": 40000},
			"retention_expires_at": "2026-12-31T03:05:16Z", "purged_at": nil,
		},
		Timeline:  timeline,
		Recording: `{"version": 2, "exchanges": []}`,
	}
}

// Ended is run r ended otherwise: status, and error code and message.
func Ended(r *Run, status, code, message string) *Run {
	r.Object["status"] = status
	r.Object["output"] = nil
	r.Object["error"] = map[string]any{"code": code, "message": message}
	return r
}
