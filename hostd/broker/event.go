package broker

import (
	"fmt"
	"strings"
)

// Message is the event's timeline wording:
// "GET example.com → 200, 12 KB", "GET crm /v1/customers → 200",
// "POST crm /v1/customers → 403 refused: method POST is not granted ...",
// "GET → 400 refused: malformed request: ..." (a request without a host).
func (e Event) Message() string {
	what := strings.TrimSpace(e.Method + " " + e.Host)
	if what == "" {
		what = "request" // one too malformed to name its method
	}
	if e.Connection != "" {
		what = e.Method + " " + e.Connection + " " + e.Path
	}
	switch {
	case e.Refused != "":
		return fmt.Sprintf("%s → %d refused: %s", what, e.Status, e.Refused)
	case e.Err != "":
		return fmt.Sprintf("%s → %d, %s, failed: %s", what, e.Status, formatBytes(e.Bytes), e.Err)
	case e.Connection != "":
		return fmt.Sprintf("%s → %d", what, e.Status)
	}
	return fmt.Sprintf("%s → %d, %s", what, e.Status, formatBytes(e.Bytes))
}

// formatBytes writes sizes the way the timeline shows them: "512 B", "12 KB", "3.4 MB".
func formatBytes(n int64) string {
	switch {
	case n < 1000:
		return fmt.Sprintf("%d B", n)
	case n < 1000*1000:
		return fmt.Sprintf("%d KB", (n+500)/1000)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}
