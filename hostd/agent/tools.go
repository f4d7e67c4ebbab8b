package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// ShellTool is the name of the tool that runs a command in the VM.
const ShellTool = "shell"

// Limits on what one model turn may ask for.
const (
	// maxArgumentBytes bounds one tool call's arguments; a longer command
	// is refused rather than sent to the guest.
	maxArgumentBytes = 64 << 10
	// maxCallsPerTurn bounds how many tool calls of one turn are run;
	// the rest are answered with an error.
	maxCallsPerTurn = 16
	// maxCommandInMessage bounds the command text shown as the timeline
	// message; the event data keeps the whole command.
	maxCommandInMessage = 1000
)

var shellSchema = json.RawMessage(`{"type":"object","properties":{` +
	`"command":{"type":"string","description":"The command line, run with bash -c as user worker in the scratch directory."},` +
	`"timeout_seconds":{"type":"integer","minimum":1,"description":"Kill the command after this many seconds (capped by the run's limit)."}},` +
	`"required":["command"],"additionalProperties":false}`)

// toolsFor offers exactly the tools the run was granted.
func toolsFor(spec runs.Spec) []model.Tool {
	var tools []model.Tool
	if spec.Shell {
		tools = append(tools, model.Tool{
			Name: ShellTool,
			Description: "Run a bash command inside this run's microVM and get its exit code, stdout and stderr. " +
				"Several calls in one turn run in parallel.",
			InputSchema: shellSchema,
		})
	}
	if spec.Web {
		tools = append(tools, webFetchTool())
	}
	if len(spec.Connections) > 0 {
		tools = append(tools, connectionTool(spec.Connections))
	}
	return tools
}

// shellArgs are the shell tool's arguments.
type shellArgs struct {
	Command        string `json:"command"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty"`
}

// decodeArgs decodes a tool call's arguments into v, refusing anything
// the tool's schema does not describe; the error is meant for the model.
func decodeArgs(tool, raw string, v any) error {
	if len(raw) > maxArgumentBytes {
		return fmt.Errorf("arguments are %d bytes, more than the limit of %d", len(raw), maxArgumentBytes)
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("arguments do not match the %s tool's schema: %v", tool, err)
	}
	if dec.More() {
		return fmt.Errorf("arguments have data after the JSON object")
	}
	return nil
}

// parseShellArgs checks a shell call's arguments; the error is meant for
// the model.
func parseShellArgs(raw string, maxTimeout time.Duration) (string, time.Duration, error) {
	var args shellArgs
	if err := decodeArgs(ShellTool, raw, &args); err != nil {
		return "", 0, err
	}
	switch {
	case strings.TrimSpace(args.Command) == "":
		return "", 0, fmt.Errorf("command is empty")
	case strings.ContainsRune(args.Command, 0):
		return "", 0, fmt.Errorf("command contains a NUL byte")
	case !utf8.ValidString(args.Command):
		return "", 0, fmt.Errorf("command is not valid UTF-8")
	case args.TimeoutSeconds < 0:
		return "", 0, fmt.Errorf("timeout_seconds must be positive")
	}
	timeout := maxTimeout
	if args.TimeoutSeconds > 0 && args.TimeoutSeconds < int64(maxTimeout/time.Second) {
		timeout = time.Duration(args.TimeoutSeconds) * time.Second
	}
	return args.Command, timeout, nil
}

// toolRun is one admitted tool call of a turn: run does the work, forModel
// renders the result.
type toolRun interface {
	run(ctx context.Context)
	forModel() (content string, isError bool)
}

// commandRun is one shell command of a turn and how it ended.
type commandRun struct {
	vm      VM
	command string
	timeout time.Duration
	entry   int64 // the command's timeline entry, 0 until it is opened

	status   vsockproto.ExitStatus
	err      error
	stdout   *vsockproto.CappedBuffer
	stderr   *vsockproto.CappedBuffer
	duration time.Duration
}

// runTools answers every tool call of one turn. The calls run
// concurrently. Before any starts, each shell command gets its timeline
// entry, in the order the model asked and at the turn's start time, so a
// live timeline shows what is running; each entry is amended with its
// command's result as that command ends (the broker puts web and
// connection requests on the timeline itself).
func (c *conversation) runTools(ctx context.Context, calls []model.ToolCall) []model.ToolResult {
	started := time.Now()
	results := make([]model.ToolResult, len(calls))
	admitted := make([]toolRun, len(calls))
	for i, call := range calls {
		results[i].CallID = call.ID
		tool, refusal := c.checkCall(ctx, call, i)
		if refusal != "" {
			results[i].Content, results[i].IsError = refusal, true
			continue
		}
		admitted[i] = tool
	}
	for _, tool := range admitted {
		if cmd, ok := tool.(*commandRun); ok {
			c.openEntry(started, cmd)
		}
	}

	var wg sync.WaitGroup
	for _, tool := range admitted {
		if tool == nil {
			continue
		}
		wg.Go(func() {
			tool.run(ctx)
			if cmd, ok := tool.(*commandRun); ok {
				c.closeEntry(started, cmd)
			}
		})
	}
	wg.Wait()

	var commands int64
	for i, tool := range admitted {
		if tool == nil {
			continue
		}
		results[i].Content, results[i].IsError = tool.forModel()
		if _, ok := tool.(*commandRun); ok {
			commands++
		}
	}
	if commands > 0 {
		_ = c.rec.Charge(ledger.Usage{ShellCommands: commands})
	}
	return results
}

// openEntry puts a command that is about to start on the timeline.
// A failed event write must not lose the results the model is owed (here
// and in closeEntry); the run's own end records the store's trouble.
func (c *conversation) openEntry(turnStart time.Time, cmd *commandRun) {
	seq, err := c.rec.StartContentEvent(turnStart, timeline.Shell, cmd.entryMessage(),
		map[string]any{"command": cmd.command, "state": timeline.Running})
	if err == nil {
		cmd.entry = seq
	}
}

// closeEntry gives a finished command's entry its result, or appends the
// whole entry now if it could not be opened.
func (c *conversation) closeEntry(turnStart time.Time, cmd *commandRun) {
	if cmd.entry == 0 {
		_ = c.rec.ContentEventAt(turnStart, timeline.Shell, cmd.entryMessage(), cmd.eventData())
		return
	}
	_ = c.rec.AmendContentEvent(cmd.entry, cmd.eventData())
}

// checkCall decides whether call may run and returns it ready to run, or
// the refusal to send back.
func (c *conversation) checkCall(ctx context.Context, call model.ToolCall, index int) (toolRun, string) {
	switch {
	case index >= maxCallsPerTurn:
		return nil, fmt.Sprintf("refused: at most %d tool calls are run per turn", maxCallsPerTurn)
	case call.ArgumentsError != "":
		return nil, "refused: " + call.ArgumentsError
	}
	switch call.Name {
	case ShellTool:
		if !c.spec.Shell {
			return nil, "refused: this run was not granted the shell"
		}
		maxTimeout := min(c.cfg.CommandTimeout, timeLeft(ctx))
		command, timeout, err := parseShellArgs(call.Arguments, max(maxTimeout, time.Second))
		if err != nil {
			return nil, "refused: " + err.Error()
		}
		return &commandRun{vm: c.vm, command: command, timeout: timeout,
			stdout: vsockproto.NewCappedBuffer(c.cfg.OutputBytes), stderr: vsockproto.NewCappedBuffer(c.cfg.OutputBytes)}, ""
	case WebFetchTool:
		if !c.spec.Web {
			return nil, "refused: this run was not granted web access"
		}
		req, err := parseWebFetchArgs(call.Arguments)
		if err != nil {
			return nil, "refused: " + err.Error()
		}
		return &egressCall{maxBody: c.cfg.OutputBytes, do: func(ctx context.Context) (*broker.Response, error) {
			return c.egress.Fetch(ctx, req)
		}}, ""
	case ConnectionTool:
		if len(c.spec.Connections) == 0 {
			return nil, "refused: this run was not granted any connection"
		}
		name, req, err := parseConnectionArgs(call.Arguments)
		if err != nil {
			return nil, "refused: " + err.Error()
		}
		return &egressCall{maxBody: c.cfg.OutputBytes, do: func(ctx context.Context) (*broker.Response, error) {
			return c.egress.ConnectionRequest(ctx, name, req)
		}}, ""
	}
	return nil, fmt.Sprintf("refused: unknown tool %q; %s", clip(call.Name, 100), offeredTools(c.spec))
}

func offeredTools(spec runs.Spec) string {
	var names []string
	for _, t := range toolsFor(spec) {
		names = append(names, t.Name)
	}
	if len(names) == 0 {
		return "this run offers no tools"
	}
	return "this run offers: " + strings.Join(names, ", ")
}

func (r *commandRun) run(ctx context.Context) {
	began := time.Now()
	r.status, r.err = r.vm.Exec(ctx, vsockproto.ExecRequest{Shell: r.command, Timeout: r.timeout}, nil, r.stdout, r.stderr)
	r.duration = time.Since(began)
	if r.err == nil && r.status.Duration > 0 {
		r.duration = r.status.Duration
	}
}

// forModel renders the command's outcome as the tool result.
func (r *commandRun) forModel() (string, bool) {
	if r.err != nil {
		return fmt.Sprintf("the command could not run to its end: %v", r.err), true
	}
	var b strings.Builder
	switch {
	case r.status.TimedOut:
		fmt.Fprintf(&b, "killed: the command ran past its timeout of %v\n", r.timeout)
	case r.status.ProcessLimit > 0:
		fmt.Fprintf(&b, "killed: the command tried to have more than %d processes and threads at once; it and everything it started were killed\n", r.status.ProcessLimit)
	case r.status.Signal != 0:
		fmt.Fprintf(&b, "killed by signal %d\n", r.status.Signal)
	default:
		fmt.Fprintf(&b, "exit code: %d\n", r.status.Code)
	}
	writeStream(&b, "stdout", r.stdout)
	writeStream(&b, "stderr", r.stderr)
	return b.String(), false
}

func writeStream(b *strings.Builder, name string, buf *vsockproto.CappedBuffer) {
	out := buf.Bytes()
	if len(out) == 0 {
		fmt.Fprintf(b, "%s: (empty)\n", name)
		return
	}
	fmt.Fprintf(b, "%s:\n%s", name, bytes.ToValidUTF8(out, []byte("\uFFFD")))
	if !bytes.HasSuffix(out, []byte("\n")) {
		b.WriteByte('\n')
	}
}

// entryMessage is the command's timeline message: "$ <command>", clipped.
func (r *commandRun) entryMessage() string {
	return timeline.Command(clip(r.command, maxCommandInMessage))
}

// eventData is the finished command's timeline data. Strings are user content: the
// Recorder drops them under zero data retention.
func (r *commandRun) eventData() map[string]any {
	data := map[string]any{
		"command":          r.command,
		"state":            timeline.Done,
		"exit_code":        r.status.Code,
		"timed_out":        r.status.TimedOut,
		"duration_ms":      r.duration.Milliseconds(),
		"stdout":           string(bytes.ToValidUTF8(r.stdout.Bytes(), []byte("\uFFFD"))),
		"stderr":           string(bytes.ToValidUTF8(r.stderr.Bytes(), []byte("\uFFFD"))),
		"output_truncated": r.stdout.Truncated() || r.stderr.Truncated(),
	}
	if r.status.Signal != 0 {
		data["signal"] = r.status.Signal
	}
	if r.status.ProcessLimit > 0 {
		data["process_limit"] = r.status.ProcessLimit
	}
	if r.err != nil {
		data["error"] = r.err.Error()
		data["exit_code"] = -1
	}
	return data
}

// clip shortens s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
