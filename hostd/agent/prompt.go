package agent

import (
	"fmt"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
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
	} else if len(toolsFor(spec)) == 0 {
		b.WriteString("- Shell: off. You have no tools in this run: answer from what you know.\n")
	} else {
		b.WriteString("- Shell: off: no command can run in the VM.\n")
	}
	writeNetwork(&b, spec, cfg)
	if len(spec.Files) == 0 {
		b.WriteString("- Files: none were provided.\n")
	} else {
		paths := make([]string, len(spec.Files))
		for i, f := range spec.Files {
			paths[i] = f.Path
		}
		fmt.Fprintf(&b, "- Files provided in the scratch directory: %s.\n", strings.Join(paths, ", "))
	}
	if len(spec.Outputs) > 0 {
		fmt.Fprintf(&b, "- Outputs: when the run ends, the regular files in the scratch directory matching %s are handed to the user "+
			"(symbolic links are not followed; at most %s each, %s together); nothing else leaves the VM.\n",
			strings.Join(spec.Outputs, ", "), timeline.ByteSize(cfg.MaxOutputFileBytes), timeline.ByteSize(cfg.MaxOutputBytes))
	}
	fmt.Fprintf(&b, "- Budget: %s left of a hard limit of %s; every model call and every second of the VM is charged to it.\n",
		money.Format(max(remainingMicros, 0)), money.Format(spec.MaxCostMicros))
	fmt.Fprintf(&b, "- Time: about %d s left before the run is stopped.\n\n", int64(max(left, 0)/time.Second))
	if final {
		b.WriteString("This is your last turn: no tool can be called any more. Give your final answer now.\n")
	} else if tools := toolsFor(spec); len(tools) > 0 {
		what := "the tools"
		if len(tools) == 1 && spec.Shell {
			what = "the shell"
		}
		b.WriteString("Use " + what + " to do the work and report the real output, never what you expect. " +
			"When you are done, reply with your final answer and no tool call.\n")
	}
	return b.String()
}

// writeNetwork states what the run may reach, and how: the broker is the
// only way out, for the tools and for code in the VM alike.
func writeNetwork(b *strings.Builder, spec runs.Spec, cfg *Config) {
	switch {
	case spec.Web:
		fmt.Fprintf(b, "- Web: on, through the host's broker only. The %s tool fetches a URL (no redirects followed; "+
			"the first %d bytes of the body are shown to you). ", WebFetchTool, cfg.OutputBytes)
		if spec.Shell {
			b.WriteString("Code in the VM reaches the web through the same broker: the proxy variables " +
				"(http_proxy, https_proxy and their upper-case forms) are set, HTTPS goes through CONNECT to port 443. " +
				"The VM has no DNS resolver of its own: the broker resolves names. ")
		}
		b.WriteString("Addresses in private networks are refused, and every web request is charged to the budget.\n")
	case len(spec.Connections) > 0:
		b.WriteString("- Web: off. The only way out of the VM is the broker, for the connections below; anything else fails.\n")
	default:
		b.WriteString("- Web: off. The VM has no network: no route out and no DNS resolver, so any network call fails.\n")
	}
	if len(spec.Connections) == 0 {
		b.WriteString("- Connections: none.\n")
		return
	}
	granted := make([]string, len(spec.Connections))
	for i, c := range spec.Connections {
		granted[i] = fmt.Sprintf("%s (%s)", c.Name, strings.Join(c.Methods, ", "))
	}
	fmt.Fprintf(b, "- Connections granted: %s. Call them with the %s tool", strings.Join(granted, "; "), ConnectionTool)
	if spec.Shell {
		fmt.Fprintf(b, ", or from code in the VM at $EPHEMERAL_CONNECTIONS_URL/<name>/<path> (%s/<name>/<path>) "+
			"through the proxy the proxy variables point to", broker.ConnectionsURL)
	}
	b.WriteString(". The broker adds the credentials, which never enter the VM: send none. " +
		"Methods not granted are refused with 403.\n")
}
