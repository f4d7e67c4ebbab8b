package tests

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/guest/limits"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// shellCallWithTimeout is a shell tool call that asks for its own timeout.
func shellCallWithTimeout(id, command string, seconds int) fakeprovider.ToolCall {
	args, _ := json.Marshal(map[string]any{"command": command, "timeout_seconds": seconds})
	return fakeprovider.ToolCall{ID: id, Name: "shell", Arguments: string(args)}
}

// A run whose commands hit every limit of the guest, through the real
// daemon and a real microVM: a fork bomb, filled filesystems, a flood of
// output. Each ends its command with a result that says what happened;
// none ends the run, the VM or the daemon, and later commands work.
func TestGuestLimitsEndToEnd(t *testing.T) {
	state := cliState(t)
	lim := limits.Defaults()
	const (
		backgroundBomb = ":(){ :|:& };:"
		foregroundBomb = "bomb() { bomb | bomb; }; bomb"
		fillScratch    = "head -c 300M /dev/zero > big"
		fillTmp        = "head -c 300M /dev/zero > /tmp/big"
		fillHome       = "head -c 300M /dev/zero > ~/big"
		sizes          = "stat -c '%s' big /tmp/big ~/big"
		flood          = "yes"
	)
	// The regular expression does not match its own command line.
	alive := "echo alive; while pgrep -u worker -f '[:][|][:]&' > /dev/null; do sleep 0.2; done; echo bomb gone"
	fake := fakeprovider.New(
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCallWithTimeout("bomb1", backgroundBomb, 20)}},
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCallWithTimeout("alive", alive, 60), shellCallWithTimeout("bomb2", foregroundBomb, 30)}},
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("fill1", fillScratch), shellCall("fill2", fillTmp), shellCall("fill3", fillHome)}},
		fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("sizes", sizes), shellCallWithTimeout("flood", flood, 5)}},
		fakeprovider.Turn{Text: "done"},
	)
	model := httptest.NewServer(fake)
	defer model.Close()
	d := startServe(t, state, "EPHEMERAL_OPENAI_BASE_URL="+model.URL+"/v1", "EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna")

	var created apiRun
	if status := d.call(t, "POST", "/v1/runs", strings.NewReader(`{"prompt": "test the limits", "shell": true, "timeout_seconds": 300, "max_cost_micros": 100000}`),
		map[string]string{"Content-Type": "application/json"}, &created); status >= 300 {
		t.Fatalf("POST /v1/runs: %d", status)
	}
	run, events := d.waitRun(t, created.ID)
	if run.Status != "succeeded" || run.Output != "done" {
		t.Fatalf("run %s, output %q, error %+v", run.Status, run.Output, run.Error)
	}
	results := map[string]map[string]any{}
	for _, ev := range events {
		if ev.Category == "Shell" && ev.Data["state"] == "done" {
			results[fmt.Sprint(ev.Data["command"])] = ev.Data
		}
	}
	field := func(command, name string) string { return fmt.Sprint(results[command][name]) }

	// The next command runs while the bomb that went to the background
	// grows, and sees it killed with all it forked once it reaches its
	// limit.
	if field(alive, "exit_code") != "0" || field(alive, "stdout") != "alive\nbomb gone\n" {
		t.Errorf("command after the fork bomb: %v", results[alive])
	}
	if field(foregroundBomb, "process_limit") != strconv.Itoa(lim.CommandProcesses) || field(foregroundBomb, "signal") != "9" {
		t.Errorf("fork bomb: %v, want killed for passing %d processes", results[foregroundBomb], lim.CommandProcesses)
	}

	for _, fill := range []string{fillScratch, fillTmp, fillHome} {
		if field(fill, "exit_code") == "0" || !strings.Contains(field(fill, "stderr"), "No space left on device") {
			t.Errorf("%s: %v, want it failed with ENOSPC", fill, results[fill])
		}
	}
	got := strings.Fields(field(sizes, "stdout"))
	want := []int{lim.ScratchMiB, lim.TmpMiB, lim.OverlayMiB}
	if len(got) != len(want) {
		t.Fatalf("sizes of the filled files: %v", results[sizes])
	}
	for i, s := range got {
		n, _ := strconv.Atoi(s)
		// The files filled their filesystems up to what their metadata
		// and the run directory left.
		if n > want[i]<<20 || n < (want[i]-2)<<20 {
			t.Errorf("file %d holds %d bytes, want up to its filesystem's %d MiB", i, n, want[i])
		}
	}

	if field(flood, "timed_out") != "true" || field(flood, "output_truncated") != "true" || !strings.Contains(field(flood, "stdout"), "bytes omitted ...]") {
		t.Errorf("output flood: timed out %s, truncated %s", field(flood, "timed_out"), field(flood, "output_truncated"))
	}
	if out := field(flood, "stdout"); len(out) > 64<<10 {
		t.Errorf("the flood's timeline entry keeps %d bytes of output", len(out))
	}
	checkCost(t, run)
}
