package api

import (
	"bytes"
	"net/http"

	"github.com/ephemeralhq/ephemeral/hostd/metrics"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	totals, err := s.store.Totals(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	var buf bytes.Buffer
	byStatus := make([]metrics.LabelValue, 0, len(store.Statuses))
	for _, st := range store.Statuses {
		byStatus = append(byStatus, metrics.LabelValue{Label: string(st), Value: totals.RunsByStatus[st]})
	}
	// Writes to a bytes.Buffer cannot fail.
	metrics.LabeledGauge(&buf, "ephemeral_runs", "Runs by status.", "status", byStatus)
	s.runs.BootDurations.Write(&buf, "ephemeral_microvm_boot_duration_seconds", "Time from boot request to microVM ready, as reported by the executor.")
	metrics.Gauge(&buf, "ephemeral_money_reserved_micros", "Money currently held for queued and running runs, in micro-dollars.", totals.Held)
	metrics.Counter(&buf, "ephemeral_money_charged_micros_total", "Money charged for finished runs since the database was created, in micro-dollars.", totals.Charged)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write(buf.Bytes())
}
