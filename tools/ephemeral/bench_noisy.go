package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// noiseSettle is how long the noisy guest spins after SIGCONT before a
// start is measured next to it: its yes processes are back at full speed.
const noiseSettle = 500 * time.Millisecond

func benchNoisy(c *cli.Context) error {
	n, mgr, err := benchSandboxes(c, "ephemeral bench noisy", 100)
	if err != nil {
		return err
	}
	defer mgr.Shutdown()
	ctx := c.Context
	measured := sandbox.Options{Start: sandbox.StartBoot}
	if c.Bool("restore") {
		measured.Start = sandbox.StartRestore
	}
	fmt.Fprintf(os.Stderr, "%d pairs of starts with %s...\n", n, mgr.Describe())

	noisy, err := mgr.Create(ctx, sandbox.Options{VCPUs: c.Int("noisy-cpus")})
	if err != nil {
		return fmt.Errorf("noisy sandbox: %w", err)
	}
	defer noisy.Destroy()
	spin, err := noisy.Start(ctx, vsockproto.ExecRequest{Shell: `for i in $(seq "$(nproc)"); do yes > /dev/null & done; wait`}, nil, nil)
	if err != nil {
		return fmt.Errorf("noisy sandbox: %w", err)
	}
	defer func() { spin.Signal(syscall.SIGKILL); spin.Wait() }()

	start := func(ctx context.Context) (startSample, error) {
		ctx, cancel := context.WithTimeout(ctx, startTimeout)
		defer cancel()
		return startSandbox(ctx, func(ctx context.Context) (*sandbox.Sandbox, error) { return mgr.Create(ctx, measured) })
	}
	var quiet, loud []startSample
	var loudCPU, loudWall time.Duration
	for i := range n {
		// The order alternates, so neither condition always comes first.
		for _, noise := range []bool{i%2 == 1, i%2 == 0} {
			if !noise {
				if err := spin.Signal(syscall.SIGSTOP); err != nil {
					return err
				}
				s, err := start(ctx)
				if err != nil {
					return fmt.Errorf("start %d next to a quiet sandbox: %w", i+1, err)
				}
				quiet = append(quiet, s)
				continue
			}
			if err := spin.Signal(syscall.SIGCONT); err != nil {
				return err
			}
			time.Sleep(noiseSettle)
			cpuBefore, cpuErr := cpuTime(noisy)
			began := time.Now()
			s, err := start(ctx)
			if err != nil {
				return fmt.Errorf("start %d next to a spinning sandbox: %w", i+1, err)
			}
			loud = append(loud, s)
			if cpuAfter, err := cpuTime(noisy); err == nil && cpuErr == nil {
				loudCPU += cpuAfter - cpuBefore
				loudWall += time.Since(began)
			}
		}
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, header("to first command finished")+"\t")
	var qs, ls, ratios []float64
	for i := range quiet {
		qs = append(qs, millis(quiet[i].firstDone))
		ls = append(ls, millis(loud[i].firstDone))
		// Each pair's ratio: the machine's noise of the moment cancels out.
		ratios = append(ratios, float64(loud[i].firstDone)/float64(quiet[i].firstDone))
	}
	fmt.Fprintf(w, "next to a quiet sandbox\t%s\t\n", summarize(qs).format(fmtMillis))
	fmt.Fprintf(w, "next to one spinning %d vCPU(s)\t%s\t\n", c.Int("noisy-cpus"), summarize(ls).format(fmtMillis))
	fmt.Fprintf(w, "ratio, spinning to quiet\t%s\t\n", summarize(ratios).format(fmtRatio))
	w.Flush()
	if loudWall > 0 {
		fmt.Printf("the spinning sandbox's VMM used %.2f CPUs meanwhile (its cgroup's quota: %d)\n",
			loudCPU.Seconds()/loudWall.Seconds(), noisy.Cgroup().Limits().CPUs)
	}
	return nil
}

// cpuTime is the CPU the sandbox's VMM has used, from its cgroup.
func cpuTime(sb *sandbox.Sandbox) (time.Duration, error) {
	g := sb.Cgroup()
	if g == nil {
		return 0, errors.New("no cgroup")
	}
	return g.CPUTime()
}

// benchSandboxes is the set-up the VM benches share: root, -n within
// 1..maxN, and a sandbox manager from the configuration with any
// leftovers of an earlier run reconciled.
func benchSandboxes(c *cli.Context, command string, maxN int) (int, *sandbox.Manager, error) {
	if err := requireRoot(c, vmsNeedRoot); err != nil {
		return 0, nil, err
	}
	n := c.Int("n")
	if n < 1 || n > maxN {
		return 0, nil, cli.Exit(fmt.Sprintf("%s: -n must be in 1..%d, got %d", command, maxN, n), 2)
	}
	loaded, err := loadConfig(c)
	if err != nil {
		return 0, nil, err
	}
	mgr, err := system.NewSandboxes(loaded.Config, "", stderrLog)
	if err != nil {
		return 0, nil, err
	}
	if _, err := mgr.Reconcile(c.Context); err != nil {
		stderrLog.Warn("reconcile leftovers", "err", err)
	}
	return n, mgr, nil
}
