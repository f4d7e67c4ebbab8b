package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

func shellEntry(seq int64, t time.Duration, command string, data map[string]any) store.Event {
	b, _ := json.Marshal(data)
	return store.Event{Seq: seq, T: t, Category: timeline.Shell, Message: timeline.Command(command), Data: b}
}

// Commands are printed when they start and their results, in timeline
// order, when they end: right below the command when nothing came in
// between, else below a line naming the command that ended.
func TestTimelinePrinterShowsCommandsWhenTheyStart(t *testing.T) {
	running := map[string]any{"state": "running"}
	done := func(stdout string, code int, ms int64) map[string]any {
		return map[string]any{"state": "done", "stdout": stdout, "exit_code": code, "duration_ms": ms}
	}
	var out strings.Builder
	p := newTimelinePrinter(&out)
	for _, ev := range []store.Event{
		{Seq: 1, T: 0, Category: timeline.Queued, Message: "Budget $0.04 reserved"},
		// Two parallel commands; the second ends first.
		shellEntry(2, 5250*time.Millisecond, "sleep 2; echo slow", running),
		shellEntry(3, 5250*time.Millisecond, "echo fast", running),
		shellEntry(3, 5250*time.Millisecond, "echo fast", done("fast\n", 0, 10)),
		shellEntry(2, 5250*time.Millisecond, "sleep 2; echo slow", done("slow\n", 1, 2000)),
		// A command on its own.
		shellEntry(4, 8*time.Second, "pwd", running),
		shellEntry(4, 8*time.Second, "pwd", done("/tmp/scratch\n", 0, 5)),
		// A command seen only once it had ended.
		shellEntry(5, 9*time.Second, "whoami", done("worker\n", 0, 5)),
		// Parallel commands seen only once ended, the second first.
		shellEntry(6, 10*time.Second, "true", running),
		shellEntry(7, 10*time.Second, "echo second", done("second\n", 0, 5)),
		shellEntry(6, 10*time.Second, "true", done("first\n", 0, 5)),
		// A result whose earlier command never reported its end is
		// printed when the run is over.
		shellEntry(8, 11*time.Second, "lost", running),
		shellEntry(9, 11*time.Second, "echo kept", done("kept\n", 0, 5)),
	} {
		p.print(ev)
	}
	p.finish()
	want := `  0.00  Queued           Budget $0.04 reserved
  5.25  Shell            $ sleep 2; echo slow
  5.25  Shell            $ echo fast
  5.25  Shell            $ sleep 2; echo slow  → exit 1 after 2.00 s
                         │ slow
  5.25  Shell            $ echo fast  → exit 0 after 0.01 s
                         │ fast
  8.00  Shell            $ pwd
                         │ /tmp/scratch
  9.00  Shell            $ whoami
                         │ worker
 10.00  Shell            $ true
                         │ first
 10.00  Shell            $ echo second
                         │ second
 11.00  Shell            $ lost
 11.00  Shell            $ echo kept
                         │ kept
`
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}
