package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/accounts"
	"github.com/ephemeralhq/ephemeral/hostd/auth"
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

const eventsPage = 500

func (s *Server) events(w http.ResponseWriter, r *http.Request, orgID string) {
	run, ok := s.loadRun(w, r, orgID)
	if !ok {
		return
	}
	if wantsSSE(r.Header.Get("Accept")) {
		p, _ := r.Context().Value(principalKey{}).(auth.Principal)
		releaseKey, ok := acquire(w, s.limiter.keyStreams, p.KeyID, "this API key")
		if !ok {
			return
		}
		defer releaseKey()
		releaseAddress, ok := acquire(w, s.limiter.addressStreams, clientAddress(r), "this address")
		if !ok {
			return
		}
		defer releaseAddress()
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

// errKeyRevoked ends an event stream whose API key stopped working.
var errKeyRevoked = errors.New("api: the event stream's API key no longer works")

// streamEvents sends the timeline as Server-Sent Events, live, until the
// run has ended and every entry is sent. Entries go out in revision order
// with their revision as the SSE id, so an amended entry is sent again (same
// "id" in its data, higher revision) and the client replaces what it had;
// a reconnecting client resumes after its Last-Event-ID revision. A client
// that reconnects to a finished run it has every entry of gets 204 No
// Content, which tells EventSource to stop reconnecting. A stream whose
// key is revoked ends with a "revoked" event, within a credential re-check.
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
	if run.Status.Terminal() && after > 0 {
		rest, err := s.store.EventsSince(r.Context(), run.ID, after, 1)
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		if len(rest) == 0 {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	// The stream also ends when the daemon shuts down: http.Server's
	// Shutdown waits for handlers but does not cancel them.
	ctx, cancel := context.WithCancelCause(r.Context())
	stop := context.AfterFunc(s.closingCtx, func() { cancel(nil) })
	defer stop()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watchCredential(ctx, cancel, r)
	}()
	defer func() {
		cancel(nil)
		<-watched
	}()
	ended, err := s.runs.Follow(ctx, run.OrgID, run.ID, after, sseWriter{w: w, flusher: flusher})
	if err != nil {
		if errors.Is(context.Cause(ctx), errKeyRevoked) {
			e := &apiError{Type: authentication, Code: "api_key_revoked", Message: "the API key this stream was opened with was revoked"}
			if s.usesSession(r) {
				e.Code, e.Message = "session_expired", "the session this stream was opened with has ended"
			}
			b, _ := json.Marshal(map[string]*apiError{"error": e})
			fmt.Fprintf(w, "event: revoked\ndata: %s\n\n", b)
			flusher.Flush()
			return
		}
		if ctx.Err() == nil {
			s.log.Error("event stream", "run", run.ID, "err", err)
		}
		return
	}
	fmt.Fprintf(w, "event: end\ndata: {\"status\":%q}\n\n", ended.Status)
	flusher.Flush()
}

// watchCredential ends the stream, with errKeyRevoked as the cause, once
// the Authorization header (or the session cookie) it was opened with no
// longer authenticates. It asks the store every credentialRecheck rather
// than waiting for a notice, because keys are also revoked by other
// processes (ephemeral admin key revoke) and sessions end on other daemons.
func (s *Server) watchCredential(ctx context.Context, cancel context.CancelCauseFunc, r *http.Request) {
	tick := time.NewTicker(s.credentialRecheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var err error
		if s.usesSession(r) {
			if _, err = s.sessions.SessionOrg(ctx, r); errors.Is(err, accounts.ErrNoSession) {
				err = auth.ErrUnauthenticated
			}
		} else {
			_, err = auth.Authenticate(ctx, s.store, r.Header.Get("Authorization"))
		}
		if errors.Is(err, auth.ErrUnauthenticated) {
			cancel(errKeyRevoked)
			return
		}
		if err != nil && ctx.Err() == nil {
			// The next tick tries again; the stream is not ended on a
			// database hiccup.
			s.log.Warn("re-check an event stream's API key", "err", err)
		}
	}
}

// sseWriter writes timeline entries as SSE "timeline" events.
type sseWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
}

func (sw sseWriter) Events(batch []store.Event) error {
	for _, e := range batch {
		b, err := json.Marshal(toEventJSON(e))
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(sw.w, "id: %d\nevent: timeline\ndata: %s\n\n", e.Rev, b); err != nil {
			return err
		}
	}
	sw.flusher.Flush()
	return nil
}

func (sw sseWriter) Idle() error {
	if _, err := fmt.Fprint(sw.w, ": keep-alive\n\n"); err != nil {
		return err
	}
	sw.flusher.Flush()
	return nil
}
