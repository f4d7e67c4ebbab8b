package agent

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// A command is on the timeline while it runs, and a parallel command that
// ends first shows its result before the turn is over.
func TestCommandsAppearOnTheTimelineWhenTheyStart(t *testing.T) {
	release := make(chan struct{})
	vm := &fakeVM{answer: func(ctx context.Context, command string) (string, string, int, error) {
		if command == "sleep 60" {
			select {
			case <-release:
			case <-ctx.Done():
				return "", "", 0, ctx.Err()
			}
			return "slept\n", "", 0, nil
		}
		return "fast\n", "", 0, nil
	}}
	e := newEnv(t, vm,
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("c1", "sleep 60"), shellCall("c2", "echo fast")}},
		fakeprovider.Turn{Text: "done"})
	spec := pageSpec("wait")
	spec.OrgID = e.orgID
	canonical, _ := json.Marshal(spec)
	submitted, _, err := e.svc.Submit(context.Background(), runs.Submission{Spec: spec, Canonical: canonical})
	if err != nil {
		t.Fatal(err)
	}

	// Wait, with the slow command still blocked, until the fast one's
	// result is on the timeline next to the slow one's running entry.
	var slow, fast store.Event
	e.waitEvents(submitted.ID, func(events []store.Event) bool {
		shell := shellEvents(events)
		if len(shell) != 2 {
			return false
		}
		slow, fast = shell[0], shell[1]
		return eventData(t, fast)["state"] == "done"
	})
	if slow.Message != "$ sleep 60" || fast.Message != "$ echo fast" || slow.T != fast.T {
		t.Fatalf("running entries %q at %v, %q at %v: want the model's order at one t", slow.Message, slow.T, fast.Message, fast.T)
	}
	if data := eventData(t, slow); data["state"] != "running" || data["command"] != "sleep 60" || data["exit_code"] != nil {
		t.Fatalf("slow command's entry while it runs: %v", data)
	}
	if data := eventData(t, fast); data["stdout"] != "fast\n" || data["exit_code"] != float64(0) || fast.Rev <= slow.Rev {
		t.Fatalf("fast command's finished entry %v at revision %d (slow at %d)", data, fast.Rev, slow.Rev)
	}

	close(release)
	r, events := e.wait(submitted.ID)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	shell := shellEvents(events)
	if len(shell) != 2 || shell[0].Seq != slow.Seq || shell[0].Rev <= fast.Rev {
		t.Fatalf("final shell entries %+v: want the slow one amended in place after the fast one", shell)
	}
	if data := eventData(t, shell[0]); data["state"] != "done" || data["stdout"] != "slept\n" || data["exit_code"] != float64(0) {
		t.Fatalf("slow command's finished entry: %v", data)
	}
}

func shellEvents(events []store.Event) []store.Event {
	var shell []store.Event
	for _, ev := range events {
		if ev.Category == timeline.Shell {
			shell = append(shell, ev)
		}
	}
	return shell
}

// waitEvents waits until done accepts the run's timeline.
func (e *env) waitEvents(runID string, done func([]store.Event) bool) {
	e.t.Helper()
	giveUp := time.After(time.Minute)
	for {
		changed := e.hub.Changed(runID)
		events, err := e.store.Events(context.Background(), runID, 0, 1000)
		if err != nil {
			e.t.Fatal(err)
		}
		if done(events) {
			return
		}
		select {
		case <-changed:
		case <-giveUp:
			e.t.Fatalf("run %s: timeline not as awaited after a minute: %q", runID, messages(events))
		}
	}
}
