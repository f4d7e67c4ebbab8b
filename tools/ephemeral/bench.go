package main

import (
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure the platform",
		Subcommands: []*cli.Command{{
			Name:  "boot",
			Usage: "boot N sandboxes one after another and print p50/p95 of each boot phase",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "n", Value: 10, Usage: "number of boots"},
				&cli.IntFlag{Name: "memory", Value: 512, Usage: "guest memory in MiB"},
			},
			Action: benchBoot,
		}, {
			Name:  "noisy",
			Usage: "boot sandboxes next to one whose guest spins all its vCPUs, and print their boot time as a ratio against a quiet host",
			Description: "Boots a noisy sandbox running `yes` on every vCPU, then N pairs of sandboxes one\n" +
				"after another: one while the noise is stopped (SIGSTOP), one while it runs. Prints\n" +
				"create→first exec p50 of both, their ratio, and what CPU the noisy VMM used of its\n" +
				"cgroup's quota while it ran.",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "n", Value: 5, Usage: "number of boots in each condition"},
				&cli.IntFlag{Name: "noisy-cpus", Value: 1, Usage: "vCPUs of the noisy sandbox"},
			},
			Action: benchNoisy,
		}},
	}
}

// bootSample is one boot's phases, in the order the table prints them.
type bootSample struct {
	network, vmmStart, kernel, init, ready, firstExec, total time.Duration
}

// unattributed is the part of ready no phase accounts for: mostly the VMM
// loading and the guest decompressing the kernel before its clock starts.
func (s bootSample) unattributed() time.Duration {
	return s.ready - s.network - s.vmmStart - s.kernel - s.init
}

func benchBoot(c *cli.Context) error {
	n := c.Int("n")
	if n < 1 || n > 1000 {
		return cli.Exit(fmt.Sprintf("ephemeral bench boot: -n must be in 1..1000, got %d", n), 2)
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
	fmt.Fprintf(os.Stderr, "booting %d sandboxes with %s...\n", n, mgr.Describe())
	var samples []bootSample
	for i := 0; i < n; i++ {
		began := time.Now()
		sb, err := mgr.Create(ctx, sandbox.Options{MemoryMiB: c.Int("memory")})
		if err != nil {
			return fmt.Errorf("boot %d: %w", i+1, err)
		}
		execBegan := time.Now()
		st, err := sb.Exec(ctx, vsockproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
		firstExec := time.Since(execBegan)
		total := time.Since(began)
		if derr := sb.Destroy(); err == nil {
			err = derr
		}
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("true exited %d", st.Code)
		}
		if err != nil {
			return fmt.Errorf("boot %d: %w", i+1, err)
		}
		t := sb.Timings()
		samples = append(samples, bootSample{t.Network, t.VMMStart, t.Kernel, t.Init, t.Ready, firstExec, total})
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "phase\tp50\tp95\t\n")
	rows := []struct {
		name string
		get  func(bootSample) time.Duration
	}{
		{"network namespace", func(s bootSample) time.Duration { return s.network }},
		{"vmm start", func(s bootSample) time.Duration { return s.vmmStart }},
		{"pre-kernel (load, decompress)", bootSample.unattributed},
		{"guest kernel", func(s bootSample) time.Duration { return s.kernel }},
		{"guest init", func(s bootSample) time.Duration { return s.init }},
		{"create→ready", func(s bootSample) time.Duration { return s.ready }},
		{"first exec", func(s bootSample) time.Duration { return s.firstExec }},
		{"create→first exec done", func(s bootSample) time.Duration { return s.total }},
	}
	for _, r := range rows {
		var ds []time.Duration
		for _, s := range samples {
			ds = append(ds, r.get(s))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t\n", r.name, fmtMillis(percentile(ds, 50)), fmtMillis(percentile(ds, 95)))
	}
	return w.Flush()
}

// percentile is the nearest-rank percentile of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := (p*len(s) + 99) / 100 // ceil(p/100 * n)
	return s[max(rank, 1)-1]
}

func fmtMillis(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}
