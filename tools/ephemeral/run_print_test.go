package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

func shellEntry(id int64, t time.Duration, command string, data map[string]any) entry {
	b, _ := json.Marshal(data)
	return entry{ID: id, T: t, Category: timeline.Shell, Message: timeline.Command(command), Data: b}
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
	for _, ev := range []entry{
		{ID: 1, T: 0, Category: timeline.Queued, Message: "Budget $0.04 reserved"},
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

// A live timeline may hand the same revisions over again (a resumed
// stream): each is printed once, and an entry other than a command's once
// whatever its revision.
func TestTimelinePrinterPrintsEachRevisionOnce(t *testing.T) {
	running := map[string]any{"state": "running"}
	done := map[string]any{"state": "done", "stdout": "worker\n", "exit_code": 0, "duration_ms": 5}
	revs := []entry{
		{ID: 1, Rev: 1, Category: timeline.Queued, Message: "Budget $0.04 reserved"},
		shellEntry(2, time.Second, "whoami", running),
		shellEntry(2, time.Second, "whoami", done),
		{ID: 3, Rev: 4, T: 2 * time.Second, Category: timeline.MicroVM, Message: "microVM destroyed"},
		{ID: 3, Rev: 5, T: 2 * time.Second, Category: timeline.MicroVM, Message: "microVM destroyed"},
	}
	revs[1].Rev, revs[2].Rev = 2, 3
	var once, twice strings.Builder
	p := newTimelinePrinter(&once)
	for _, ev := range revs {
		p.stream(ev)
	}
	q := newTimelinePrinter(&twice)
	for _, ev := range append(append(revs[:3:3], revs[1:]...), revs...) {
		q.stream(ev)
	}
	want := `  0.00  Queued           Budget $0.04 reserved
  1.00  Shell            $ whoami
                         │ worker
  2.00  MicroVM          microVM destroyed
`
	if once.String() != want || twice.String() != want {
		t.Errorf("printed\n%s\nand, revisions repeated,\n%s\nwant\n%s", once.String(), twice.String(), want)
	}
}

// What a guest printed cannot drive the terminal: control characters and
// invalid UTF-8 are shown as U+FFFD.
func TestTimelinePrinterDefusesEscapes(t *testing.T) {
	var out strings.Builder
	p := newTimelinePrinter(&out)
	p.print(shellEntry(1, 0, "printf '\\033]0;owned\\007'", map[string]any{"state": "done", "stdout": "\x1b]0;owned\x07\x1b[2J\xffok\ttab\n"}))
	if strings.Contains(out.String(), "\x1b") || strings.Contains(out.String(), "\x07") || !strings.Contains(out.String(), "│ �]0;owned��[2J�ok\ttab\n") {
		t.Errorf("printed %q", out.String())
	}
}
