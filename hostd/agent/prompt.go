package agent

import (
	"fmt"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// systemPrompt tells the model the truth about where it runs and what it
// may do. It is rebuilt for every call because the budget and time left
// change.
func systemPrompt(spec runs.Spec, scratchDir string, remainingMicros int64, left time.Duration, cfg *Config, final bool) string {
	var b strings.Builder
	b.WriteString("You are an agent working inside an ephemeral sandbox: a microVM created for this run alone. " +
		"It is destroyed when the run ends, with everything written in it.\n\n")
	if spec.Shell {
		fmt.Fprintf(&b, "- Shell: on. The shell tool runs `bash -c <command>` as the unprivileged user worker "+
			"in the scratch directory %s, inside the VM only. Each command may run at most %d s; "+
			"the first and last %d bytes of its stdout and stderr are shown to you, with the cut marked.\n",
			scratchDir, int64(cfg.CommandTimeout/time.Second), cfg.OutputBytes)
	} else {
		b.WriteString("- Shell: off. You have no tools in this run: answer from what you know.\n")
	}
	if spec.Web {
		b.WriteString("- Web: granted, but no web tool is available in this version.\n")
	} else {
		b.WriteString("- Web: off. The VM has no network: no route out and no DNS resolver, so any network call fails.\n")
	}
	if len(spec.Connections) == 0 {
		b.WriteString("- Connections: none.\n")
	} else {
		names := make([]string, len(spec.Connections))
		for i, c := range spec.Connections {
			names[i] = c.Name
		}
		fmt.Fprintf(&b, "- Connections granted (not yet usable from a tool): %s.\n", strings.Join(names, ", "))
	}
	if len(spec.Files) == 0 {
		b.WriteString("- Files: none were provided.\n")
	} else {
		paths := make([]string, len(spec.Files))
		for i, f := range spec.Files {
			paths[i] = f.Path
		}
		fmt.Fprintf(&b, "- Files provided in the scratch directory: %s.\n", strings.Join(paths, ", "))
	}
	fmt.Fprintf(&b, "- Budget: %s left of a hard limit of %s; every model call and every second of the VM is charged to it.\n",
		money.Format(max(remainingMicros, 0)), money.Format(spec.MaxCostMicros))
	fmt.Fprintf(&b, "- Time: about %d s left before the run is stopped.\n\n", int64(max(left, 0)/time.Second))
	if final {
		b.WriteString("This is your last turn: no tool can be called any more. Give your final answer now.\n")
	} else if spec.Shell {
		b.WriteString("Use the shell to do the work and report the real output, never what you expect. " +
			"When you are done, reply with your final answer and no tool call.\n")
	}
	return b.String()
}
