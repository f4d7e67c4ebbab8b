// Package fakeprovider is a scripted language-model server for tests. It
// speaks the real wire formats of OpenAI Chat Completions
// (POST /v1/chat/completions) and Anthropic Messages (POST /v1/messages),
// answers each request with the next Turn of its script, and keeps every
// request it received so tests can assert on what the client sent (the tool
// results, max_tokens, the auth headers).
//
// Like the real APIs it refuses requests that are wrong: a missing or wrong
// key (401), a tool result that answers no tool call, a tool call left
// unanswered, Anthropic without max_tokens or anthropic-version (400). A
// refused request does not use up a turn.
//
// Server is an http.Handler: mount it on httptest.NewServer. Point an
// OpenAI client at <url>/v1 and an Anthropic client at <url>.
package fakeprovider

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Turn is one scripted answer.
type Turn struct {
	Text      string     `json:"text,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	Usage     Usage      `json:"usage"`
	// StopReason replaces the wire's finish_reason / stop_reason (for
	// example with one the client does not know). Empty picks the right
	// one: tool calls or end of turn.
	StopReason string `json:"stop_reason,omitempty"`
	// Status, when set and not 200, answers with this HTTP status and an
	// error body in the API's format instead of a completion.
	Status int `json:"status,omitempty"`
	// RetryAfter is sent as the Retry-After header when set.
	RetryAfter string `json:"retry_after,omitempty"`
	// DelayMillis holds the answer back (a slow provider); a client that
	// gives up first ends the wait.
	DelayMillis int `json:"delay_ms,omitempty"`
	// RawBody, when set, is the whole 200 response body, sent verbatim
	// (malformed output).
	RawBody string `json:"raw_body,omitempty"`
}

// ToolCall is one scripted tool call.
type ToolCall struct {
	// ID defaults to a generated one in the API's style.
	ID   string `json:"id,omitempty"`
	Name string `json:"name"`
	// Arguments is the arguments' JSON text, sent as written: it may be
	// invalid on purpose.
	Arguments string `json:"arguments"`
}

// Usage is the token usage a turn reports.
type Usage struct {
	InputTokens       int64 `json:"input_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens,omitempty"`
}

// API names a wire format.
type API string

const (
	OpenAI    API = "openai"
	Anthropic API = "anthropic"
)

// Request is what the server received, with the parts tests usually check
// already decoded.
type Request struct {
	API    API
	Header http.Header
	Body   []byte
	// Status is what the server answered.
	Status int

	Model string
	// MaxTokens is the answer bound the client asked for and
	// MaxTokensField the field that carried it (OpenAI has two).
	MaxTokens      int
	MaxTokensField string
	System         string
	// Messages counts the conversation's messages as sent on the wire
	// (system message included for OpenAI).
	Messages  int
	ToolNames []string
	// ToolResults are the results the last message(s) carried back.
	ToolResults []ToolResult
}

// ToolResult is one tool result found in a request.
type ToolResult struct {
	CallID  string
	Content string
	IsError bool
}

// Server is the scripted fake. Its methods are safe for concurrent use.
type Server struct {
	// APIKey, when set, must be presented (Bearer token for OpenAI,
	// x-api-key for Anthropic).
	APIKey string
	// OnRequest, when set, is called with every request as it is
	// recorded (the command logs them).
	OnRequest func(Request)

	mu       sync.Mutex
	script   []Turn
	next     int
	received []Request
}

// New returns a server that will answer with script, one turn per request.
func New(script ...Turn) *Server { return &Server{script: script} }

// Append adds turns to the end of the script.
func (s *Server) Append(turns ...Turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, turns...)
}

// Requests returns copies of the requests received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.received...)
}

// Remaining is the number of turns not yet served.
func (s *Server) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.script) - s.next
}

// maxRequestBytes bounds what the fake reads of a request.
const maxRequestBytes = 32 << 20

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var api API
	switch r.URL.Path {
	case "/v1/chat/completions":
		api = OpenAI
	case "/v1/messages":
		api = Anthropic
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, api, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	body, err := readBody(w, r)
	rec := Request{API: api, Header: r.Header.Clone(), Body: body}
	if err == nil {
		if api == OpenAI {
			err = decodeOpenAI(&rec, s.APIKey)
		} else {
			err = decodeAnthropic(&rec, s.APIKey)
		}
	}
	if err != nil {
		status := http.StatusBadRequest
		if ae, ok := err.(authError); ok {
			status = ae.status
		}
		s.record(rec, status)
		writeError(w, api, status, err.Error())
		return
	}

	turn, n, ok := s.take()
	if !ok {
		s.record(rec, http.StatusBadRequest)
		writeError(w, api, http.StatusBadRequest, fmt.Sprintf("fakeprovider: script exhausted after %d turns", n))
		return
	}
	status := turn.Status
	if status == 0 || turn.RawBody != "" {
		status = http.StatusOK
	}
	s.record(rec, status)

	if turn.DelayMillis > 0 {
		t := time.NewTimer(time.Duration(turn.DelayMillis) * time.Millisecond)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if turn.RetryAfter != "" {
		w.Header().Set("Retry-After", turn.RetryAfter)
	}
	switch {
	case turn.RawBody != "":
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(turn.RawBody))
	case status != http.StatusOK:
		writeError(w, api, status, fmt.Sprintf("fakeprovider: scripted HTTP %d", status))
	case api == OpenAI:
		writeJSON(w, http.StatusOK, openAIResponse(turn, rec.Model, n))
	default:
		writeJSON(w, http.StatusOK, anthropicResponse(turn, rec.Model, n))
	}
}

// take returns the next turn and its 1-based number, or the number of
// turns served when the script is exhausted.
func (s *Server) take() (Turn, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next >= len(s.script) {
		return Turn{}, s.next, false
	}
	t := s.script[s.next]
	s.next++
	return t, s.next, true
}

func (s *Server) record(rec Request, status int) {
	rec.Status = status
	s.mu.Lock()
	s.received = append(s.received, rec)
	s.mu.Unlock()
	if s.OnRequest != nil {
		s.OnRequest(rec)
	}
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	buf, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		return nil, fmt.Errorf("read request body: %v", err)
	}
	return buf, nil
}

// authError is a refusal with its own status (401).
type authError struct {
	status int
	msg    string
}

func (e authError) Error() string { return e.msg }

func writeError(w http.ResponseWriter, api API, status int, msg string) {
	errType := errorType(status)
	if api == Anthropic {
		writeJSON(w, status, map[string]any{
			"type":  "error",
			"error": map[string]any{"type": errType, "message": msg},
		})
		return
	}
	writeJSON(w, status, map[string]any{
		"error": map[string]any{"message": msg, "type": errType, "param": nil, "code": nil},
	})
}

func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == 529:
		return "overloaded_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
