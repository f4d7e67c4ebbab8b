package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"

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
	// The JSON form pages with ?after= the same way.
	var page struct{ Data []eventJSON }
	h.do("GET", "/v1/runs/"+run.ID+"/events?after=5", "").decode(t, &page)
	if len(page.Data) != 2 || page.Data[0].ID != 6 {
		t.Fatalf("after=5: %+v", page.Data)
	}
}

func decodeEvent(t *testing.T, e sseEvent) eventJSON {
	t.Helper()
	var ev eventJSON
	if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
		t.Fatalf("event %+v: %v", e, err)
	}
	if strconv.FormatInt(ev.ID, 10) != e.id {
		t.Fatalf("SSE id %q but data id %d", e.id, ev.ID)
	}
	return ev
}
