package broker

import (
	"fmt"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// Message is the event's timeline wording:
// "GET example.com → 200, 12 KB", "GET crm /v1/customers → 200",
// "POST crm /v1/customers → 403 refused: method POST is not granted ...".
func (e Event) Message() string {
	what := e.Method + " " + e.Host
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

// RunObserver records a session's events on a run's timeline and charges
// its web requests to the run's budget at the daemon's web price
// (ledger.Rates.WebMicrosPerRequest).
type RunObserver struct {
	Rec *runs.Recorder
}

// ChargeWeb charges one web request; it fails once the budget is spent,
// which also stops the run.
func (o RunObserver) ChargeWeb() error {
	return o.Rec.Charge(ledger.Usage{WebRequests: 1})
}

// Record appends the event at its start time. Hosts and paths are user
// content: under zero data retention only the numbers are kept.
func (o RunObserver) Record(e Event) {
	category := timeline.Web
	data := map[string]any{"status": e.Status, "bytes": e.Bytes, "refused": e.Refused != ""}
	if e.Connection != "" {
		category = timeline.Connection
		data["connection"] = e.Connection
	}
	// A failed write loses one line of the timeline, not the request:
	// the Recorder's own store errors surface elsewhere.
	o.Rec.ContentEventAt(e.Start, category, e.Message(), data)
}

var _ Observer = RunObserver{}
