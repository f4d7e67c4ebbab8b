// Package timeline holds the wording of a run's timeline, taken from the
// product page ("Budget $0.04 reserved", "microVM ready", "$0.00353
// charged, $0.03647 released"), and the Hub that wakes live event streams
// when a run's timeline grows.
package timeline

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/money"
)

// Categories as the product page labels them.
const (
	Queued          = "Queued"
	MicroVM         = "MicroVM"
	Shell           = "Shell"
	Web             = "Web"
	Connection      = "Connection"
	Network         = "Network"
	Model           = "Model"
	Output          = "Output"
	Webhook         = "Webhook"
	Successful      = "Successful"
	Failed          = "Failed"
	TimedOut        = "Timed out"
	BudgetExceeded  = "Budget exceeded"
	Canceled        = "Canceled"
	WorkerDestroyed = "Worker destroyed"
	// Timeline entries are about the timeline itself.
	Timeline = "Timeline"
)

// Fixed messages.
const (
	MicroVMReady     = "microVM ready"
	MicroVMDestroyed = "microVM destroyed"
)

// State is how far along a command's entry is: the entry is appended when
// the command starts and amended with its result when it ends, so a live
// timeline shows a long command while it runs. A State is a system word,
// never user content.
type State string

// States of a command's entry.
const (
	Running State = "running"
	Done    State = "done"
	// Interrupted closes the entry of a command whose daemon died while it
	// ran: its result is unknown.
	Interrupted State = "interrupted"
)

// Reserved is the first entry of every run: "Budget $0.04 reserved".
func Reserved(micros int64) string { return "Budget " + money.Format(micros) + " reserved" }

// WorkerStarted states the run's permissions: "worker started · shell on ·
// web off", with the granted connections after them when there are any
// ("· connections crm, billing").
func WorkerStarted(shell, web bool, connections ...string) string {
	s := "worker started · shell " + onOff(shell) + " · web " + onOff(web)
	if len(connections) > 0 {
		s += " · connections " + strings.Join(connections, ", ")
	}
	return s
}

// EgressBlocked reports what the sandbox's firewall dropped during the
// run: "egress blocked: 3 packets (DNS 1, IPv6 0, other 2)".
func EgressBlocked(dns, ipv6, other uint64) string {
	return fmt.Sprintf("egress blocked: %s (DNS %d, IPv6 %d, other %d)", plural(int64(dns+ipv6+other), "packet"), dns, ipv6, other)
}

// Command is a shell entry: "$ pwd; whoami".
func Command(cmd string) string { return "$ " + cmd }

// ModelSummary closes a successful run: "3 model calls, 5,214 tokens".
func ModelSummary(calls, tokens int64) string {
	return plural(calls, "model call") + ", " + plural(tokens, "token")
}

// Settled is the last entry of every run: "$0.00353 charged, $0.03647 released".
func Settled(charged, released int64) string {
	return money.Format(charged) + " charged, " + money.Format(released) + " released"
}

// TimedOutAfter says the hard timeout stopped the run.
func TimedOutAfter(seconds int) string {
	return fmt.Sprintf("timeout of %d s reached, microVM destroyed", seconds)
}

// LimitReached says the budget stopped the run.
func LimitReached(limit int64) string {
	return "budget of " + money.Format(limit) + " reached, run stopped"
}

// RecordingCapped says a run's recording of its model turns reached its
// size cap at a turn: "recording cap of 8 MiB reached: turn 13 and later
// turns are not recorded".
func RecordingCapped(turn int, limitBytes int64) string {
	return fmt.Sprintf("recording cap of %s reached: turn %d and later turns are not recorded", ByteSize(limitBytes), turn)
}

// TimelineCapped says what a run's timeline left out once it reached its
// size cap: entries not stored at all, and entries stored without their
// output. "timeline cap of 4 MiB reached: 12 entries not stored, 1 cut
// short (1.3 MiB)".
func TimelineCapped(dropped, cut, droppedBytes, limitBytes int64) string {
	var parts []string
	if dropped > 0 || cut == 0 {
		parts = append(parts, pluralEntries(dropped)+" not stored")
	}
	if cut > 0 {
		parts = append(parts, money.Count(cut)+" cut short")
	}
	return fmt.Sprintf("timeline cap of %s reached: %s (%s)", ByteSize(limitBytes), strings.Join(parts, ", "), ByteSize(droppedBytes))
}

// OutputKept says an output file was copied out of the microVM: "kept
// report.md (1.2 KiB)".
func OutputKept(path string, size int64) string {
	return fmt.Sprintf("kept %s (%s)", path, ByteSize(size))
}

// OutputSkipped says why a matching entry was not kept: "skipped
// out/big.csv: 12 MiB over the 10 MiB per-file cap".
func OutputSkipped(path, why string) string { return "skipped " + path + ": " + why }

// OverFileCap is why a file too large was skipped.
func OverFileCap(size, limit int64) string {
	return fmt.Sprintf("%s over the %s per-file cap", ByteSize(size), ByteSize(limit))
}

// OverRunCap is why a file that would take the run past its cap was
// skipped.
func OverRunCap(size, limit int64) string {
	return fmt.Sprintf("%s would take the run's outputs past their %s cap", ByteSize(size), ByteSize(limit))
}

// GrewPastCap is why a file that grew while it was copied was skipped.
func GrewPastCap(limit int64) string {
	return fmt.Sprintf("grew while being copied, past the %s it could take", ByteSize(limit))
}

// OutputUnmatched says a pattern matched nothing: "nothing matches
// out/*.csv".
func OutputUnmatched(pattern string) string { return "nothing matches " + pattern }

// OutputsTruncated says the listing stopped at its cap.
func OutputsTruncated(max int) string {
	return fmt.Sprintf("more than %s entries match the output patterns; the rest are skipped", money.Count(int64(max)))
}

// WebhookDelivered closes a run's webhook delivery: "webhook delivered:
// 204 after 2 attempts".
func WebhookDelivered(status, attempts int) string {
	return fmt.Sprintf("webhook delivered: %d after %s", status, plural(int64(attempts), "attempt"))
}

// WebhookFailed says every attempt failed: "webhook failed after 6
// attempts (last: 503)".
func WebhookFailed(attempts int, last string) string {
	return fmt.Sprintf("webhook failed after %s (last: %s)", plural(int64(attempts), "attempt"), last)
}

func pluralEntries(n int64) string {
	if n == 1 {
		return "1 entry"
	}
	return money.Count(n) + " entries"
}

// ByteSize writes a size for people: "512 bytes", "4 MiB", "1.3 MiB".
func ByteSize(n int64) string {
	const kib, mib = 1 << 10, 1 << 20
	var s string
	switch {
	case n < kib:
		return plural(n, "byte")
	case n < mib:
		s = strconv.FormatFloat(float64(n)/kib, 'f', 1, 64) + " KiB"
	default:
		s = strconv.FormatFloat(float64(n)/mib, 'f', 1, 64) + " MiB"
	}
	return strings.Replace(s, ".0 ", " ", 1)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return money.Count(n) + " " + noun + "s"
}
