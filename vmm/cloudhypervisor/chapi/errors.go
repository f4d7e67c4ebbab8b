package chapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Bounds on what an error response may put into an error message: the VMM
// echoes configuration values (paths, and so names a caller chose) back in
// its messages.
const (
	maxErrorMessages    = 16
	maxErrorMessageSize = 512
)

// APIError is a non-2xx answer from the VMM.
type APIError struct {
	// Operation is the endpoint, e.g. "vm.boot".
	Operation  string
	StatusCode int
	// Messages is the VMM's error chain, outermost first. Cloud Hypervisor
	// answers errors with a JSON array of strings; any other body becomes
	// a single message.
	Messages []string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: HTTP %d", e.Operation, e.StatusCode)
	for _, m := range e.Messages {
		fmt.Fprintf(&b, ": %q", m)
	}
	return b.String()
}

// parseErrorBody turns an error response body into bounded messages.
func parseErrorBody(body []byte) []string {
	var chain []string
	if err := json.Unmarshal(body, &chain); err != nil {
		text := strings.TrimSpace(string(body))
		if text == "" {
			return nil
		}
		chain = []string{text}
	}
	if len(chain) > maxErrorMessages {
		dropped := len(chain) - maxErrorMessages + 1
		chain = append(chain[:maxErrorMessages-1:maxErrorMessages-1], fmt.Sprintf("(%d more)", dropped))
	}
	for i, m := range chain {
		chain[i] = truncate(m, maxErrorMessageSize)
	}
	return chain
}

// truncate shortens s to at most max bytes without splitting a UTF-8
// sequence, marking the cut.
func truncate(s string, max int) string {
	const mark = "..."
	if len(s) <= max {
		return s
	}
	cut := max - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
