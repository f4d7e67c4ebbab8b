package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/tools/ephemeral/internal/client"
)

// entry is a timeline entry as the printer reads it, whether the runs
// service of this process (ephemeral run) or the API (ephemeral runs)
// handed it over.
type entry struct {
	ID       int64 // place on the timeline
	Rev      int64 // the revision that last wrote it
	T        time.Duration
	Category string
	Message  string
	Data     json.RawMessage
}

func entryFromStore(e store.Event) entry {
	return entry{ID: e.Seq, Rev: e.Rev, T: e.T, Category: e.Category, Message: e.Message, Data: e.Data}
}

func entryFromAPI(e client.Event) entry {
	t := time.Duration(math.Round(e.T * float64(time.Second)))
	return entry{ID: e.ID, Rev: e.Rev, T: t, Category: e.Category, Message: e.Message, Data: e.Data}
}

// timelinePrinter writes timeline entries as they arrive, as the product
// page shows them. A command's entry arrives when the command starts and
// again, amended, when it ends. Results are printed in timeline order, so
// parallel commands read the same however they finish: a result waits for
// those of the earlier commands still running. A result goes right below
// its command's line when nothing was printed in between, else below a
// line repeating the command with its exit code and duration. Each
// revision is printed once, however often it is handed over (a resumed
// event stream), and other entries once whatever their revision.
type timelinePrinter struct {
	out     io.Writer
	rev     int64           // the revision streamed last
	printed map[int64]bool  // entries whose line is out
	last    int64           // the entry printed last
	pending []int64         // commands whose result is not out, in timeline order
	ended   map[int64]entry // results waiting for earlier commands'
	results map[int64]bool  // commands whose result is out
}

func newTimelinePrinter(out io.Writer) *timelinePrinter {
	return &timelinePrinter{out: out, printed: map[int64]bool{}, ended: map[int64]entry{}, results: map[int64]bool{}}
}

// commandData is what the printer reads of a shell entry's data.
type commandData struct {
	State      timeline.State `json:"state"`
	Stdout     string         `json:"stdout"`
	Stderr     string         `json:"stderr"`
	ExitCode   int            `json:"exit_code"`
	DurationMS int64          `json:"duration_ms"`
}

// stream prints an entry of a live timeline, where entries come in
// revision order: one whose revision was printed already is skipped.
func (p *timelinePrinter) stream(ev entry) {
	if ev.Rev <= p.rev {
		return
	}
	p.rev = ev.Rev
	p.print(ev)
}

// print prints an entry, or keeps a command's result until it is its turn.
func (p *timelinePrinter) print(ev entry) {
	var data commandData
	if ev.Category != timeline.Shell || json.Unmarshal(ev.Data, &data) != nil {
		if !p.printed[ev.ID] {
			p.line(ev.T, ev.Category, clipLine(ev.Message, 100))
			p.printed[ev.ID], p.last = true, ev.ID
		}
		return
	}
	if p.results[ev.ID] {
		return
	}
	if !slices.Contains(p.pending, ev.ID) {
		i, _ := slices.BinarySearch(p.pending, ev.ID)
		p.pending = slices.Insert(p.pending, i, ev.ID)
	}
	if data.State == timeline.Running {
		if !p.printed[ev.ID] {
			p.line(ev.T, ev.Category, clipLine(ev.Message, 100))
			p.printed[ev.ID], p.last = true, ev.ID
		}
		return
	}
	p.ended[ev.ID] = ev
	for len(p.pending) > 0 {
		first, ok := p.ended[p.pending[0]]
		if !ok {
			return
		}
		p.result(first)
		delete(p.ended, first.ID)
		p.pending = p.pending[1:]
	}
}

// finish prints the results still waiting, for when an earlier command's
// result will never come (its entry could not be amended).
func (p *timelinePrinter) finish() {
	for _, id := range p.pending {
		if ev, ok := p.ended[id]; ok {
			p.result(ev)
		}
	}
	p.pending, p.ended = nil, map[int64]entry{}
}

// result prints a finished command's output.
func (p *timelinePrinter) result(ev entry) {
	var data commandData
	json.Unmarshal(ev.Data, &data) // print checked it decodes
	switch {
	case !p.printed[ev.ID]:
		p.line(ev.T, ev.Category, clipLine(ev.Message, 100))
	case p.last != ev.ID:
		took := time.Duration(data.DurationMS) * time.Millisecond
		p.line(ev.T, ev.Category, fmt.Sprintf("%s  → exit %d after %.2f s", clipLine(ev.Message, 100), data.ExitCode, took.Seconds()))
	}
	p.printed[ev.ID], p.last, p.results[ev.ID] = true, ev.ID, true
	for _, line := range strings.Split(strings.TrimRight(data.Stdout+data.Stderr, "\n"), "\n") {
		if line != "" {
			fmt.Fprintf(p.out, "%25s│ %s\n", "", clipLine(line, 100))
		}
	}
}

func (p *timelinePrinter) line(t time.Duration, category, message string) {
	fmt.Fprintf(p.out, "%6.2f  %-16s %s\n", t.Seconds(), printable(category), message)
}

// printOutcome prints what follows a run's timeline: its answer, if any,
// under label, and the cost line.
func printOutcome(w io.Writer, label string, output *string, model, web, compute int64) {
	if output != nil {
		fmt.Fprintf(w, "\n%s:\n%s\n", label, printable(*output))
	}
	fmt.Fprintf(w, "\nmodel %s · web %s · compute %s\n", money.Format(model), money.Format(web), money.Format(compute))
}

// Exit statuses of the commands that follow a run to its end (ephemeral
// run, runs create --follow, runs events --follow): 0 when it succeeded,
// else one per way it can end; 1 remains the command's own failure.
var runExitCodes = map[string]int{
	client.Failed:         3,
	client.TimedOut:       4,
	client.BudgetExceeded: 5,
	client.Canceled:       6,
}

// exitCodesHelp documents runExitCodes in the commands' help.
const exitCodesHelp = "Exit status: 0 when the run succeeded, 3 failed, 4 timed_out, 5 budget_exceeded, 6 canceled; " +
	"1 when the command itself failed (bad input, daemon unreachable, an API error)."

// runOutcome is the command's result for a run that ended in status.
func runOutcome(status, message string) error {
	if status == client.Succeeded {
		return nil
	}
	code, ok := runExitCodes[status]
	if !ok {
		code = 1
	}
	text := "ephemeral: the run ended " + printable(status)
	if message != "" {
		text += ": " + printable(message)
	}
	return cli.Exit(text, code)
}

// clipLine makes s printable and cuts it to n characters.
func clipLine(s string, n int) string {
	r := []rune(printable(s))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n]) + "…"
}

// printable replaces control characters (but tabs and newlines) and
// invalid UTF-8 with U+FFFD: what a guest printed, or a daemon sent, must
// not drive the terminal it is shown on (escape sequences can retitle it,
// rewrite earlier lines or worse).
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || r < ' ' && r != '\t' && r != '\n' || r >= 0x7f && r < 0xa0 {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, string(utf8.RuneError)))
}
