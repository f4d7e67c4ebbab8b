package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// FollowEvents follows the run's timeline live, from after the revision
// after (0: from the start), until the run has ended, and returns the
// status it ended in. fn gets each entry in revision order, each revision
// once: a shell command's entry comes when the command starts and again,
// with the same ID and a higher Rev, when it ends.
//
// The stream is the API's Server-Sent Events: `event: timeline` entries
// whose SSE id is their revision, keep-alive comments, then `event: end`
// with the final status, or `event: revoked` when the key stops working
// (an *Error). When the connection drops, or stays silent past StreamIdle,
// FollowEvents waits (Backoff, or the server's Retry-After) and reconnects
// with Last-Event-ID set to the last revision it handed to fn, so nothing
// comes twice and nothing is missed; an entry cut off mid-way is dropped
// and comes again whole. A 204 on reconnecting means the run has ended and
// every entry was sent. It gives up after Reconnects broken connections in
// a row that delivered no entry, and at once on an answer that retrying
// cannot change (401, 404) or an error from fn.
func (c *Client) FollowEvents(ctx context.Context, id string, after int64, fn func(Event) error) (string, error) {
	last := after
	failures := 0
	for {
		status, progressed, err := c.streamOnce(ctx, id, &last, fn)
		var broken *brokenStream
		if !errors.As(err, &broken) {
			return status, err
		}
		if progressed {
			failures = 0
		}
		failures++
		if failures > c.opts.Reconnects {
			return "", fmt.Errorf("events of %s: the stream broke %d times in a row without delivering an entry: %w",
				id, failures, broken.err)
		}
		wait := max(c.opts.Backoff(failures), min(broken.retryAfter, c.opts.MaxRetryWait))
		c.opts.Logf("events of %s: %v; reconnecting in %s with Last-Event-ID %d", id, broken.err, wait, last)
		if err := sleep(ctx, wait); err != nil {
			return "", err
		}
	}
}

// brokenStream is a failure that reconnecting may cure: the connection
// dropped or went silent, or the server was busy (429, 5xx).
type brokenStream struct {
	err        error
	retryAfter time.Duration
}

func (b *brokenStream) Error() string { return b.err.Error() }
func (b *brokenStream) Unwrap() error { return b.err }

// errNoAnswer ends a connection whose answer did not begin within
// RequestTimeout.
var errNoAnswer = errors.New("the daemon did not answer the event-stream request in time")

// errStreamSilent ends a connection that sent nothing, not even a
// keep-alive, for StreamIdle.
var errStreamSilent = errors.New("the event stream went silent")

// streamOnce reads one connection's worth of the stream. It returns the
// final status when the run ended, whether it handed fn a new entry, and
// a *brokenStream when the connection failed in a way worth retrying.
func (c *Client) streamOnce(ctx context.Context, id string, last *int64, fn func(Event) error) (status string, progressed bool, err error) {
	connCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	header := http.Header{"Accept": {"text/event-stream"}, "Cache-Control": {"no-cache"}}
	if *last > 0 {
		header.Set("Last-Event-ID", strconv.FormatInt(*last, 10))
	}
	// The stream has no deadline, but its answer must begin in time.
	waiting := time.AfterFunc(c.opts.RequestTimeout, func() { cancel(errNoAnswer) })
	resp, err := c.send(connCtx, request{method: http.MethodGet, path: runPath(id, "/events"), header: header})
	waiting.Stop()
	if err != nil {
		if ctx.Err() != nil {
			return "", false, context.Cause(ctx)
		}
		return "", false, &brokenStream{err: err}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNoContent:
		// Nothing after Last-Event-ID, and nothing will come: the end
		// event was lost with the connection. Ask how the run ended.
		run, err := c.GetRun(ctx, id)
		var apiErr *Error
		if err != nil && !errors.As(err, &apiErr) && ctx.Err() == nil {
			return "", false, &brokenStream{err: err}
		}
		if err != nil {
			return "", false, err
		}
		if !Terminal(run.Status) {
			return "", false, fmt.Errorf("events of %s: the stream is over but the run is still %s", id, run.Status)
		}
		return run.Status, false, nil
	case resp.StatusCode >= 400:
		err := readError(resp)
		if e := err.(*Error); e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500 {
			return "", false, &brokenStream{err: err, retryAfter: e.RetryAfter}
		}
		return "", false, err
	case resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		return "", false, fmt.Errorf("events of %s: the answer is %s %q, not an event stream",
			id, resp.Status, resp.Header.Get("Content-Type"))
	}

	silence := time.AfterFunc(c.opts.StreamIdle, func() { cancel(errStreamSilent) })
	defer silence.Stop()
	stream := &sseReader{r: bufio.NewReader(resp.Body), onLine: func() { silence.Reset(c.opts.StreamIdle) }}
	for {
		msg, err := stream.next()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return "", progressed, context.Cause(ctx)
		case errors.Is(err, errMessageTooLong):
			return "", progressed, fmt.Errorf("events of %s: %w", id, err)
		case errors.Is(context.Cause(connCtx), errStreamSilent):
			return "", progressed, &brokenStream{err: fmt.Errorf("%w for %s", errStreamSilent, c.opts.StreamIdle)}
		case errors.Is(err, io.EOF):
			return "", progressed, &brokenStream{err: errors.New("the daemon closed the event stream before the run ended")}
		default:
			return "", progressed, &brokenStream{err: err}
		}
		switch msg.event {
		case "timeline":
			ev, err := decodeEvent(msg.data)
			if err != nil {
				return "", progressed, fmt.Errorf("events of %s: %w", id, err)
			}
			if ev.Rev <= *last {
				continue // had it already: a server resending is no reason to print twice
			}
			if err := fn(ev); err != nil {
				return "", progressed, err
			}
			*last, progressed = ev.Rev, true
		case "end":
			var end struct {
				Status string `json:"status"`
			}
			if err := json.Unmarshal(msg.data, &end); err != nil || !Terminal(end.Status) {
				return "", progressed, fmt.Errorf("events of %s: the end event names no final status: %.100s", id, msg.data)
			}
			return end.Status, progressed, nil
		case "revoked":
			e := &Error{StatusCode: http.StatusUnauthorized, Type: "authentication_error", Code: "api_key_revoked",
				Message: "the API key was revoked while the stream was open"}
			var body struct {
				Error *Error `json:"error"`
			}
			if json.Unmarshal(msg.data, &body) == nil && body.Error != nil && body.Error.Message != "" {
				body.Error.StatusCode = http.StatusUnauthorized
				e = body.Error
			}
			return "", progressed, e
		}
		// Other event types are for other clients.
	}
}

// maxMessageBytes bounds one event-stream message: an entry carries at
// most a command's output, which the daemon caps well below this.
const maxMessageBytes = 16 << 20

var errMessageTooLong = fmt.Errorf("an event-stream message exceeds %d bytes", maxMessageBytes)

// sseMessage is one dispatched Server-Sent Event.
type sseMessage struct {
	event string
	id    string
	data  []byte
}

// sseReader parses a text/event-stream: "field: value" lines, ended by LF
// or CRLF; comments (":" lines, the keep-alives); a blank line dispatches
// the message. A message the stream ends in the middle of is never
// dispatched. The "retry" field is ignored: the client has its backoff.
type sseReader struct {
	r      *bufio.Reader
	line   []byte
	onLine func() // called for every line, so silence can be timed
}

func (s *sseReader) next() (sseMessage, error) {
	var msg sseMessage
	var data bytes.Buffer
	hasData := false
	for {
		line, err := s.readLine()
		if err != nil {
			return sseMessage{}, err
		}
		s.onLine()
		switch {
		case len(line) == 0:
			if !hasData { // nothing to dispatch
				msg = sseMessage{}
				continue
			}
			if msg.event == "" {
				msg.event = "message"
			}
			msg.data = data.Bytes()
			return msg, nil
		case line[0] == ':':
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			msg.event = string(value)
		case "id":
			if !bytes.ContainsRune(value, 0) {
				msg.id = string(value)
			}
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.Write(value)
			hasData = true
			if data.Len() > maxMessageBytes {
				return sseMessage{}, errMessageTooLong
			}
		}
	}
}

// readLine returns the next whole line without its ending; a line the
// stream ends in the middle of is an error (io.EOF or the read's).
func (s *sseReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		chunk, err := s.r.ReadSlice('\n')
		s.line = append(s.line, chunk...)
		if len(s.line) > maxMessageBytes {
			return nil, errMessageTooLong
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		line := s.line[:len(s.line)-1]
		return bytes.TrimSuffix(line, []byte("\r")), nil
	}
}
