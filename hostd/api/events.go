package api

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// eventJSON is one timeline entry. ID is its place on the timeline; Rev
// is the run's revision that last wrote it: an entry amended later (a shell
// command's, when the command ends) keeps its ID and gets a higher Rev.
type eventJSON struct {
	ID       int64           `json:"id"`
	Rev      int64           `json:"rev"`
	T        float64         `json:"t"` // seconds since the run was queued
	Category string          `json:"category"`
	Message  string          `json:"message"`
	Data     json.RawMessage `json:"data"`
}

func toEventJSON(e store.Event) eventJSON {
	data := e.Data
	if len(data) == 0 {
		data = json.RawMessage("{}")
	}
	return eventJSON{ID: e.Seq, Rev: e.Rev, T: math.Round(e.T.Seconds()*1000) / 1000, Category: e.Category, Message: e.Message, Data: data}
}

const (
	eventsPage        = 500
	heartbeatInterval = 15 * time.Second
)

func (s *Server) events(w http.ResponseWriter, r *http.Request, orgID string) {
	run, ok := s.loadRun(w, r, orgID)
	if !ok {
		return
	}
	if wantsSSE(r.Header.Get("Accept")) {
		s.streamEvents(w, r, run)
		return
	}
	after, apiErr := cursor(r.URL.Query().Get("after"), "after")
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	list, err := s.store.Events(r.Context(), run.ID, after, eventsPage+1)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	page := struct {
		Object    string       `json:"object"`
		RunStatus store.Status `json:"run_status"`
		Data      []eventJSON  `json:"data"`
		HasMore   bool         `json:"has_more"`
	}{Object: "list", RunStatus: run.Status, Data: []eventJSON{}, HasMore: len(list) > eventsPage}
	for _, e := range list[:min(len(list), eventsPage)] {
		page.Data = append(page.Data, toEventJSON(e))
	}
	writeJSON(w, http.StatusOK, page)
}

func wantsSSE(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mediaType, _, _ := strings.Cut(part, ";")
		if strings.EqualFold(strings.TrimSpace(mediaType), "text/event-stream") {
			return true
		}
	}
	return false
}

func cursor(v, param string) (int64, *apiError) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, badParam(param, "parameter_invalid", param+" must be a non-negative event id")
	}
	return n, nil
}

// streamEvents sends the timeline as Server-Sent Events, live, until the
// run has ended and every entry is sent. Entries go out in revision order
// with their revision as the SSE id, so an amended entry is sent again (same
// "id" in its data, higher revision) and the client replaces what it had;
// a reconnecting client resumes after its Last-Event-ID revision.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, run store.Run) {
	after, apiErr := cursor(r.Header.Get("Last-Event-ID"), "Last-Event-ID")
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.internalError(w, r, fmt.Errorf("api: response writer cannot flush"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	heartbeat := time.NewTicker(heartbeatInterval)
	defer heartbeat.Stop()
	ctx := r.Context()
	for {
		// Take the wake-up channel before reading so an entry appended
		// between the read and the wait still wakes us.
		changed := s.hub.Changed(run.ID)
		list, err := s.store.EventsSince(ctx, run.ID, after, eventsPage)
		if err != nil {
			s.log.Error("event stream", "run", run.ID, "err", err)
			return
		}
		for _, e := range list {
			b, _ := json.Marshal(toEventJSON(e))
			if _, err := fmt.Fprintf(w, "id: %d\nevent: timeline\ndata: %s\n\n", e.Rev, b); err != nil {
				return
			}
			after = e.Rev
		}
		flusher.Flush()
		if len(list) == eventsPage {
			continue
		}
		current, err := s.store.GetRun(ctx, run.OrgID, run.ID)
		if err != nil {
			s.log.Error("event stream", "run", run.ID, "err", err)
			return
		}
		if current.Status.Terminal() {
			// The final entries are written in the same transaction as the
			// terminal status; one more read after seeing it gets them all.
			rest, err := s.store.EventsSince(ctx, run.ID, after, eventsPage)
			if err != nil {
				return
			}
			if len(rest) > 0 {
				continue
			}
			fmt.Fprintf(w, "event: end\ndata: {\"status\":%q}\n\n", current.Status)
			flusher.Flush()
			return
		}
		select {
		case <-changed:
		case <-heartbeat.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
	}
}
