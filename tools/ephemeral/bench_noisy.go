package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

func benchNoisy(c *cli.Context) error {
	n := c.Int("n")
	if n < 1 || n > 100 {
		return cli.Exit(fmt.Sprintf("ephemeral bench noisy: -n must be in 1..100, got %d", n), 2)
	}
	ctx := c.Context
	loaded, err := loadConfig(c)
	if err != nil {
		return err
	}
	mgr, err := system.NewSandboxes(loaded.Config, "", stderrLog)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "booting with %s...\n", mgr.Describe())

	noisy, err := mgr.Create(ctx, sandbox.Options{VCPUs: c.Int("noisy-cpus")})
	if err != nil {
		return fmt.Errorf("noisy sandbox: %w", err)
	}
	defer noisy.Destroy()
	spin, err := noisy.Start(ctx, vsockproto.ExecRequest{Shell: `for i in $(seq "$(nproc)"); do yes > /dev/null & done; wait`}, nil, nil)
	if err != nil {
		return fmt.Errorf("noisy sandbox: %w", err)
	}

	var quiet, loud []time.Duration
	var loudCPU, loudWall time.Duration
	for i := 0; i < n; i++ {
		if err := spin.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		d, err := bootAndExec(ctx, mgr)
		if err != nil {
			return fmt.Errorf("boot %d next to a quiet sandbox: %w", i+1, err)
		}
		quiet = append(quiet, d)

		if err := spin.Signal(syscall.SIGCONT); err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond) // the noise is back at full speed
		cpuBefore, cpuErr := cpuTime(noisy)
		began := time.Now()
		d, err = bootAndExec(ctx, mgr)
		if err != nil {
			return fmt.Errorf("boot %d next to a spinning sandbox: %w", i+1, err)
		}
		loud = append(loud, d)
		if cpuAfter, err := cpuTime(noisy); err == nil && cpuErr == nil {
			loudCPU += cpuAfter - cpuBefore
			loudWall += time.Since(began)
		}
	}
	spin.Signal(syscall.SIGKILL)
	spin.Wait()

	q, l := percentile(quiet, 50), percentile(loud, 50)
	fmt.Printf("create→first exec done, p50 of %d: next to a quiet sandbox %s, next to one spinning %d vCPU(s) %s: ratio %.2f\n",
		n, fmtMillis(q), c.Int("noisy-cpus"), fmtMillis(l), float64(l)/float64(q))
	if loudWall > 0 {
		fmt.Printf("the spinning sandbox's VMM used %.2f CPUs meanwhile (its cgroup's quota: %d)\n",
			loudCPU.Seconds()/loudWall.Seconds(), noisy.Cgroup().Limits().CPUs)
	}
	return nil
}

// bootAndExec boots a sandbox, runs true in it and destroys it, and
// returns how long the user waited for the command's result.
func bootAndExec(ctx context.Context, mgr *sandbox.Manager) (time.Duration, error) {
	began := time.Now()
	sb, err := mgr.Create(ctx, sandbox.Options{})
	if err != nil {
		return 0, err
	}
	st, err := sb.Exec(ctx, vsockproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
	took := time.Since(began)
	err = errors.Join(err, sb.Destroy())
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("true exited %d", st.Code)
	}
	return took, err
}

// cpuTime is the CPU the sandbox's VMM has used, from its cgroup.
func cpuTime(sb *sandbox.Sandbox) (time.Duration, error) {
	g := sb.Cgroup()
	if g == nil {
		return 0, errors.New("no cgroup")
	}
	return g.CPUTime()
}
