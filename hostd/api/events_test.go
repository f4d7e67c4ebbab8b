package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// steppedExecutor records one event per value received on steps.
func steppedExecutor(steps <-chan string) scriptedExecutor {
	return func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		for {
			select {
			case msg, ok := <-steps:
				if !ok {
					return runs.Result{Output: "done"}, nil
				}
				if err := rec.Event(timeline.MicroVM, msg, nil); err != nil {
					return runs.Result{}, err
				}
			case <-ctx.Done():
				return runs.Result{}, ctx.Err()
			}
		}
	}
}

func TestEventStreamIsLive(t *testing.T) {
	steps := make(chan string)
	h := newHarness(t, harnessConfig{executor: steppedExecutor(steps)})
	run := h.createRun(productPageRequest)

	req, _ := http.NewRequest("GET", h.url+"/v1/runs/"+run.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	stream := newSSEReader(resp)
	if e := stream.next(t); e.data == "" || decodeEvent(t, e).Message != "Budget $0.04 reserved" {
		t.Fatalf("first event %+v", e)
	}
	// Each step appears on the open stream while the run is still going.
	for i := range 3 {
		msg := fmt.Sprint("step ", i)
		steps <- msg
		if e := stream.next(t); decodeEvent(t, e).Message != msg {
			t.Fatalf("live event %+v, want %q", e, msg)
		}
	}
	close(steps)
	var tail []string
	for {
		e := stream.next(t)
		if e.event == "end" {
			if e.data != `{"status":"succeeded"}` {
				t.Fatalf("end event %+v", e)
			}
			break
		}
		tail = append(tail, decodeEvent(t, e).Category)
	}
	if len(tail) != 2 || tail[0] != timeline.Successful || tail[1] != timeline.WorkerDestroyed {
		t.Fatalf("closing events %v", tail)
	}
}

func TestEventStreamResumesAfterLastEventID(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	run := h.createRun(productPageRequest)
	all := h.sse(run.ID, "")
	if len(all) != 8 || all[len(all)-1].event != "end" {
		t.Fatalf("full stream: %+v", all)
	}
	resumed := h.sse(run.ID, all[3].id)
	if len(resumed) != len(all)-4 {
		t.Fatalf("resumed after %s: got %d events, want %d", all[3].id, len(resumed), len(all)-4)
	}
	for i, e := range resumed {
		if e != all[i+4] {
			t.Fatalf("resumed event %d = %+v, want %+v", i, e, all[i+4])
		}
	}
	for i, e := range all[:len(all)-1] {
		if e.id != strconv.Itoa(i+1) || e.event != "timeline" {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	if resp := h.do("GET", "/v1/runs/"+run.ID+"/events", "", "Accept", "text/event-stream", "Last-Event-ID", "x"); resp.status != http.StatusBadRequest ||
		resp.apiError(t).Param != "Last-Event-ID" {
		t.Fatalf("bad Last-Event-ID: %d %s", resp.status, resp.body)
	}
	// A finished run's stream, resumed after its last entry, ends for
	// good: 204 makes EventSource stop reconnecting.
	last := all[len(all)-2].id
	if resp := h.do("GET", "/v1/runs/"+run.ID+"/events", "", "Accept", "text/event-stream", "Last-Event-ID", last); resp.status != http.StatusNoContent || len(resp.body) != 0 {
		t.Fatalf("reconnect after the last entry %s of a finished run: %d %q, want 204", last, resp.status, resp.body)
	}
	// The JSON form pages with ?after= the same way.
	var page struct{ Data []eventJSON }
	h.do("GET", "/v1/runs/"+run.ID+"/events?after=5", "").decode(t, &page)
	if len(page.Data) != 2 || page.Data[0].ID != 6 {
		t.Fatalf("after=5: %+v", page.Data)
	}
}

// A command's entry is streamed when it starts and again, amended, when it
// ends; a client resuming after the first sending gets the amendment.
func TestEventStreamResendsAmendedEvents(t *testing.T) {
	finish := make(chan struct{})
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		seq, err := rec.StartContentEvent(time.Now(), timeline.Shell, "$ sleep 60", map[string]any{"command": "sleep 60", "state": timeline.Running})
		if err != nil {
			return runs.Result{}, err
		}
		select {
		case <-finish:
		case <-ctx.Done():
			return runs.Result{}, ctx.Err()
		}
		if err := rec.AmendContentEvent(seq, map[string]any{"command": "sleep 60", "state": timeline.Done, "exit_code": 0, "stdout": "slept\n"}); err != nil {
			return runs.Result{}, err
		}
		return runs.Result{Output: "done"}, nil
	})})
	run := h.createRun(productPageRequest)

	req, _ := http.NewRequest("GET", h.url+"/v1/runs/"+run.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	stream := newSSEReader(resp)
	if e := decodeEvent(t, stream.next(t)); e.Category != timeline.Queued {
		t.Fatalf("first event %+v", e)
	}
	runningSSE := stream.next(t)
	running := decodeEvent(t, runningSSE)
	if running.Message != "$ sleep 60" || string(running.Data) != `{"command":"sleep 60","state":"running"}` {
		t.Fatalf("running entry %+v", running)
	}
	close(finish)
	done := decodeEvent(t, stream.next(t))
	if done.ID != running.ID || done.Rev <= running.Rev || done.Message != running.Message || done.T != running.T {
		t.Fatalf("amended entry %+v after %+v: want the same id and t with a higher rev", done, running)
	}
	var data map[string]any
	if err := json.Unmarshal(done.Data, &data); err != nil || data["state"] != "done" || data["stdout"] != "slept\n" {
		t.Fatalf("amended data %s: %v", done.Data, err)
	}

	// Resuming after the running entry's SSE id sends its amendment.
	resumed := h.sse(run.ID, runningSSE.id)
	if len(resumed) < 2 || resumed[len(resumed)-1].event != "end" {
		t.Fatalf("resumed stream %+v", resumed)
	}
	if e := decodeEvent(t, resumed[0]); e.ID != running.ID || e.Rev != done.Rev || string(e.Data) != string(done.Data) {
		t.Fatalf("resumed stream starts with %+v, want the amended entry %+v", e, done)
	}
	// The JSON list shows the entry once, in its place, as amended.
	var page struct{ Data []eventJSON }
	h.do("GET", "/v1/runs/"+run.ID+"/events", "").decode(t, &page)
	var shell []eventJSON
	for i, e := range page.Data {
		if e.ID != int64(i+1) {
			t.Fatalf("JSON list out of timeline order: %+v", page.Data)
		}
		if e.Category == timeline.Shell {
			shell = append(shell, e)
		}
	}
	if len(shell) != 1 || shell[0].ID != running.ID || shell[0].Rev != done.Rev || string(shell[0].Data) != string(done.Data) {
		t.Fatalf("JSON list's shell entries %+v, want the amended one once", shell)
	}
}

func decodeEvent(t *testing.T, e sseEvent) eventJSON {
	t.Helper()
	var ev eventJSON
	if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
		t.Fatalf("event %+v: %v", e, err)
	}
	if strconv.FormatInt(ev.Rev, 10) != e.id {
		t.Fatalf("SSE id %q but data rev %d", e.id, ev.Rev)
	}
	return ev
}
