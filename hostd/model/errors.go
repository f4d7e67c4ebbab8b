package model

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrMalformedResponse wraps every failure to make sense of a
	// provider's answer (invalid JSON, no choices, wrong shapes).
	ErrMalformedResponse = errors.New("malformed model response")
	// ErrResponseTooLarge is returned when a response body passes the
	// client's size cap; the body is not read further.
	ErrResponseTooLarge = errors.New("model response too large")
)

// APIError is a non-success HTTP answer from a provider.
type APIError struct {
	// Provider names the client ("openai", "anthropic").
	Provider   string
	StatusCode int
	// Type and Message come from the provider's error body when it had
	// one; Message is otherwise a prefix of the raw body.
	Type    string
	Message string
	// RetryAfter is the server's Retry-After, zero when absent.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	msg := fmt.Sprintf("%s: HTTP %d", e.Provider, e.StatusCode)
	if e.Type != "" {
		msg += " " + e.Type
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Temporary reports whether retrying the same request may succeed: rate
// limits, timeouts and server errors (Anthropic's 529 overload included).
func (e *APIError) Temporary() bool {
	switch {
	case e.StatusCode == 408, e.StatusCode == 409, e.StatusCode == 429:
		return true
	case e.StatusCode >= 500:
		return true
	}
	return false
}
