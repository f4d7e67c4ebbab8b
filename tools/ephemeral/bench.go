package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// benchCommand measures what users wait for and what idle VMs cost. Every
// figure comes with the baseline it is compared to, measured in the same
// run, because this machine's speed varies with what else runs on it.
func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure sandbox starts against a raw QEMU boot, interleaved (see also: bench density, bench noisy)",
		Description: `Each round starts, in turn, a raw QEMU boot of the sandbox's machine (the
baseline), a cold sandbox (booted), a restored one (a clone of a template)
and one taken from a warm pool, and times each to ready and to its first
command finished; the order rotates every round so that the machine's
noise hits all alike. It prints medians, interquartile ranges and n (p95
from 20 rounds on) and each variant's ratio to the raw boot of its round.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "n", Value: 10, Usage: "rounds (each starts every variant once)"},
			&cli.IntFlag{Name: "memory", Value: 512, Usage: "guest memory in MiB"},
		},
		Action: benchStart,
		Subcommands: []*cli.Command{{
			Name:  "density",
			Usage: "hold N idle sandboxes and print what each costs the host: PSS, idle CPU",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "n", Value: 20, Usage: "idle sandboxes to hold at once"},
				&cli.IntFlag{Name: "memory", Value: 512, Usage: "guest memory in MiB"},
				&cli.BoolFlag{Name: "boot", Usage: "boot the sandboxes instead of restoring them from a template"},
				&cli.DurationFlag{Name: "settle", Value: 15 * time.Second, Usage: "wait this long after the last start before measuring"},
				&cli.DurationFlag{Name: "interval", Value: 20 * time.Second, Usage: "measure idle CPU over this long"},
			},
			Action: benchDensity,
		}, {
			Name:  "noisy",
			Usage: "start sandboxes next to one whose guest spins all its vCPUs, and print their start as a ratio against a quiet neighbour",
			Description: "Starts a noisy sandbox running `yes` on every vCPU, then N pairs of sandboxes one\n" +
				"after another (cold boots, or clones with --restore): one while the noise is stopped\n" +
				"(SIGSTOP), one while it runs, the order alternating. Prints create→first command done\n" +
				"of both, each pair's ratio, and what CPU the noisy VMM used of its cgroup's quota while\n" +
				"it ran.",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "n", Value: 5, Usage: "pairs of starts"},
				&cli.IntFlag{Name: "noisy-cpus", Value: 1, Usage: "vCPUs of the noisy sandbox"},
				&cli.BoolFlag{Name: "restore", Usage: "restore the measured sandboxes from a template instead of booting them"},
			},
			Action: benchNoisy,
		}, benchStoreCommand, benchQueueCommand},
	}
}

// summary describes a sample.
type summary struct {
	n                     int
	median, p25, p75, p95 float64
}

// summarize computes xs' median, quartiles and 95th percentile, each
// interpolated linearly between the closest ranks.
func summarize(xs []float64) summary {
	s := slices.Clone(xs)
	slices.Sort(s)
	return summary{n: len(s), median: quantile(s, 0.5), p25: quantile(s, 0.25), p75: quantile(s, 0.75), p95: quantile(s, 0.95)}
}

// quantile of sorted s, interpolated (the default of R and NumPy).
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (pos-float64(lo))*(s[hi]-s[lo])
}

// minP95 is the sample size from which a 95th percentile means something.
const minP95 = 20

// format writes s with f for each value: "median  p25–p75  n" and, from
// minP95 values on, the p95.
func (s summary) format(f func(float64) string) string {
	out := fmt.Sprintf("%s\t%s–%s\t%d", f(s.median), f(s.p25), f(s.p75), s.n)
	if s.n >= minP95 {
		out += "\t" + f(s.p95)
	} else {
		out += "\t—"
	}
	return out
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fmtMillis(ms float64) string {
	if ms < 100 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

func fmtRatio(r float64) string { return fmt.Sprintf("%.3f", r) }

func fmtMiB(mib float64) string { return fmt.Sprintf("%.1f MiB", mib) }

func fmtPercent(p float64) string { return fmt.Sprintf("%.2f%%", p) }

// header is the column header of tables of summaries.
func header(first string) string {
	return strings.Join([]string{first, "median", "IQR (p25–p75)", "n", "p95"}, "\t") + "\t"
}
