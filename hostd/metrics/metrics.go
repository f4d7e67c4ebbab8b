// Package metrics writes the daemon's figures in the Prometheus text
// exposition format. It is hand-written because the daemon exposes a handful
// of series and needs no client library for that.
package metrics

import (
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
)

// Histogram counts observed durations in cumulative buckets.
type Histogram struct {
	bounds []float64 // upper bounds in seconds, ascending

	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative
	sum    float64
	total  uint64
}

// NewHistogram makes a histogram with the given upper bounds in seconds.
func NewHistogram(bounds ...float64) *Histogram {
	return &Histogram{bounds: bounds, counts: make([]uint64, len(bounds))}
}

// Observe records one duration.
func (h *Histogram) Observe(d time.Duration) {
	s := d.Seconds()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, b := range h.bounds {
		if s <= b {
			h.counts[i]++
			break
		}
	}
	h.sum += s
	h.total++
}

// Write emits the histogram named name with its HELP line.
func (h *Histogram) Write(w io.Writer, name, help string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name); err != nil {
		return err
	}
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		if _, err := fmt.Fprintf(w, "%s_bucket{le=%q} %d\n", name, strconv.FormatFloat(b, 'g', -1, 64), cum); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %s\n%s_count %d\n",
		name, h.total, name, strconv.FormatFloat(h.sum, 'g', -1, 64), name, h.total)
	return err
}

// Gauge writes one unlabelled gauge.
func Gauge(w io.Writer, name, help string, v int64) error {
	_, err := fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	return err
}

// Counter writes one unlabelled counter; name should end in _total.
func Counter(w io.Writer, name, help string, v int64) error {
	_, err := fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	return err
}

// LabeledGauge writes a gauge family with one label.
func LabeledGauge(w io.Writer, name, help, label string, values []LabelValue) error {
	if _, err := fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name); err != nil {
		return err
	}
	for _, v := range values {
		if _, err := fmt.Fprintf(w, "%s{%s=%q} %d\n", name, label, v.Label, v.Value); err != nil {
			return err
		}
	}
	return nil
}

// LabelValue is one series of a labelled gauge.
type LabelValue struct {
	Label string
	Value int64
}
