package api

import (
	"encoding/json"
	"net/http"
)

// apiError is the body of every error response:
// {"error": {"type", "code", "message", "param"}}.
type apiError struct {
	Status  int    `json:"-"`
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	// MinimumMicros is the least max_cost_micros the request could run
	// with (budget_too_small).
	MinimumMicros int64 `json:"minimum_micros,omitempty"`
	// UsableModels lists the models a run may name (model_required).
	UsableModels []string `json:"usable_models,omitempty"`
}

func (e *apiError) Error() string { return e.Message }

// Error types, as clients branch on them.
const (
	invalidRequest = "invalid_request_error"
	authentication = "authentication_error"
	idempotency    = "idempotency_error"
	rateLimit      = "rate_limit_error"
	insufficient   = "insufficient_funds_error"
	conflict       = "conflict_error"
	internal       = "api_error"
)

func badParam(param, code, message string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: code, Message: message, Param: param}
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, map[string]*apiError{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v) // a failed write means the client left; nothing to tell it
}
