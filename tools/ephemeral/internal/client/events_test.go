package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/tools/ephemeral/internal/fakeapi"
)

const pageRunID = "run_0123456789abcdef0123456789abcdef"

// follow follows the page's run on api and returns the revisions handed
// over, the final status and the Last-Event-ID of each connection.
func follow(t *testing.T, api *fakeapi.Server, opts Options) ([]int64, string, []string, error) {
	t.Helper()
	c, _ := newTestClient(t, api, opts)
	var revs []int64
	status, err := c.FollowEvents(context.Background(), pageRunID, 0, func(e Event) error {
		revs = append(revs, e.Rev)
		return nil
	})
	var resumed []string
	for _, r := range api.Requests() {
		if r.Accept == "text/event-stream" {
			resumed = append(resumed, r.LastEventID)
		}
	}
	return revs, status, resumed, err
}

func pageAPI() *fakeapi.Server {
	api := fakeapi.New(testKey)
	api.AddRun(fakeapi.PageRun(pageRunID))
	return api
}

// Amended entries come again with their ID and a higher revision, and the
// end event carries the final status.
func TestFollowHandsOverEveryRevisionOnce(t *testing.T) {
	api := pageAPI()
	c, _ := newTestClient(t, api, Options{})
	var got []string
	status, err := c.FollowEvents(context.Background(), pageRunID, 0, func(e Event) error {
		var state string
		if strings.Contains(string(e.Data), `"state":"done"`) {
			state = " done"
		}
		got = append(got, fmt.Sprintf("%d/%d%s", e.ID, e.Rev, state))
		return nil
	})
	want := "[1/1 2/2 3/3 4/4 5/5 4/6 done 5/7 done 6/8 7/9 7/10 done 6/11 done 8/12 9/13 10/14]"
	if err != nil || status != Succeeded || fmt.Sprint(got) != want {
		t.Errorf("got %v %q %v, want %s", got, status, err, want)
	}
}

// A connection that drops, cleanly or in the middle of an entry, is
// resumed from the last revision handed over: nothing twice, nothing
// missed. When the end event is what was lost, the 204 on reconnecting
// ends the follow with the run's status, read from the run.
func TestFollowResumesAfterADroppedStream(t *testing.T) {
	api := pageAPI()
	api.Cuts = []fakeapi.Cut{{After: 3, Partial: true}, {After: 4}, {After: 7}}
	revs, status, resumed, err := follow(t, api, Options{})
	if err != nil || status != Succeeded {
		t.Fatalf("status %q, %v", status, err)
	}
	if fmt.Sprint(revs) != "[1 2 3 4 5 6 7 8 9 10 11 12 13 14]" {
		t.Errorf("revisions %v", revs)
	}
	// The cut connections, then the 204.
	if fmt.Sprint(resumed) != "[ 3 7 14]" {
		t.Errorf("Last-Event-ID of each connection %q", resumed)
	}
	last := api.Requests()[len(api.Requests())-1]
	if last.Method != "GET" || last.Path != "/v1/runs/"+pageRunID || last.Accept == "text/event-stream" {
		t.Errorf("after the 204: %+v", last)
	}
}

// A server that sends an entry again after a reconnect does not get it
// handed over twice.
func TestFollowSkipsRevisionsItHas(t *testing.T) {
	api := pageAPI()
	api.Cuts = []fakeapi.Cut{{After: 5}}
	api.RepeatOnReconnect = true
	revs, status, _, err := follow(t, api, Options{})
	if err != nil || status != Succeeded || fmt.Sprint(revs) != "[1 2 3 4 5 6 7 8 9 10 11 12 13 14]" {
		t.Errorf("revisions %v, %q %v", revs, status, err)
	}
}

// A stream that keeps breaking without delivering anything is given up
// after Reconnects tries; one that breaks while delivering goes on.
func TestFollowGivesUp(t *testing.T) {
	api := pageAPI()
	api.Cuts = []fakeapi.Cut{{After: 0}, {After: 0}, {After: 0}, {After: 0}}
	_, _, resumed, err := follow(t, api, Options{Reconnects: 3})
	if err == nil || !strings.Contains(err.Error(), "the stream broke 4 times in a row without delivering an entry") || len(resumed) != 4 {
		t.Errorf("%d connections: %v", len(resumed), err)
	}

	api = pageAPI()
	var cuts []fakeapi.Cut
	for range 13 {
		cuts = append(cuts, fakeapi.Cut{After: 1}) // one entry per connection
	}
	api.Cuts = cuts
	revs, status, _, err := follow(t, api, Options{Reconnects: 2})
	if err != nil || status != Succeeded || len(revs) != 14 {
		t.Errorf("a stream broken after every entry: %d revisions, %q %v", len(revs), status, err)
	}
}

// 401 and 404 end the follow at once; a revoked key's end event is an
// authentication error; 429 is waited out.
func TestFollowStopsOnAnswersRetryingCannotChange(t *testing.T) {
	api := pageAPI()
	c, _ := newTestClient(t, api, Options{})
	var apiErr *Error
	if _, err := c.FollowEvents(context.Background(), "run_00000000000000000000000000000000", 0, func(Event) error { return nil }); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("unknown run: %v", err)
	}
	wrong, _ := newTestClient(t, api, Options{APIKey: "eph_0123456789abcdef_wrong"})
	if _, err := wrong.FollowEvents(context.Background(), pageRunID, 0, func(Event) error { return nil }); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Errorf("wrong key: %v", err)
	}
	if n := len(api.Requests()); n != 2 {
		t.Errorf("%d requests, want one each", n)
	}

	revoked := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "id: 1\nevent: timeline\ndata: {\"id\":1,\"rev\":1,\"t\":0,\"category\":\"Queued\",\"message\":\"m\",\"data\":{}}\n\n")
		fmt.Fprint(w, "event: revoked\ndata: {\"error\":{\"type\":\"authentication_error\",\"code\":\"api_key_revoked\",\"message\":\"the API key this stream was opened with was revoked\"}}\n\n")
	})
	c, _ = newTestClient(t, revoked, Options{})
	var revs []int64
	_, err := c.FollowEvents(context.Background(), pageRunID, 0, func(e Event) error { revs = append(revs, e.Rev); return nil })
	if !errors.As(err, &apiErr) || apiErr.Code != "api_key_revoked" || apiErr.StatusCode != 401 || len(revs) != 1 {
		t.Errorf("revoked: %v after %v", err, revs)
	}

	api = pageAPI()
	api.Throttle(2, "0")
	revs2, status, _, err := follow(t, api, Options{})
	if err != nil || status != Succeeded || len(revs2) != 14 {
		t.Errorf("after two 429s: %d revisions, %q %v", len(revs2), status, err)
	}
}

// A stream that stays silent, not even a keep-alive, counts as dropped.
func TestFollowReconnectsASilentStream(t *testing.T) {
	connections := 0
	silent := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		connections++
		w.Header().Set("Content-Type", "text/event-stream")
		if connections == 1 {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // says nothing until the client leaves
			return
		}
		fmt.Fprint(w, "event: end\ndata: {\"status\":\"canceled\"}\n\n")
	})
	c, log := newTestClient(t, silent, Options{StreamIdle: 50 * time.Millisecond})
	status, err := c.FollowEvents(context.Background(), pageRunID, 0, func(Event) error { return nil })
	if err != nil || status != Canceled || connections != 2 || !strings.Contains(log.String(), "the event stream went silent for 50ms; reconnecting") {
		t.Errorf("%q %v after %d connections; log:\n%s", status, err, connections, log)
	}
}

// An error from the caller's function ends the follow with that error.
func TestFollowStopsWhenTheCallerFails(t *testing.T) {
	c, _ := newTestClient(t, pageAPI(), Options{})
	stop := errors.New("stop")
	n := 0
	_, err := c.FollowEvents(context.Background(), pageRunID, 0, func(Event) error {
		if n++; n == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 3 {
		t.Errorf("%v after %d", err, n)
	}
}

// The parser takes LF and CRLF line ends, multi-line data, comments and
// fields without a space, and never dispatches a message cut short.
func TestSSEReader(t *testing.T) {
	stream := ": keep-alive\r\n\r\n" +
		"id: 7\r\nevent: timeline\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n" +
		"event:end\ndata:{\"status\":\"failed\"}\n\n" +
		"retry: 10\n\n" + // no data: nothing dispatched
		"event: timeline\ndata: {\"cut\""
	r := &sseReader{r: bufioReader(stream), onLine: func() {}}
	var got []string
	for {
		msg, err := r.next()
		if err != nil {
			got = append(got, "err "+err.Error())
			break
		}
		got = append(got, fmt.Sprintf("%s id=%q %s", msg.event, msg.id, msg.data))
	}
	want := `[timeline id="7" {"a":` + "\n" + `1} end id="" {"status":"failed"} err EOF]`
	if fmt.Sprint(got) != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }
