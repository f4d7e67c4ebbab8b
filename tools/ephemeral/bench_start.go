package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/qemu"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// startTimeout bounds one start and its two commands; it catches a hang,
// it measures nothing.
const startTimeout = 3 * time.Minute

// startSample is one start of one variant.
type startSample struct {
	// ready is from asking to a guest that takes commands; firstDone
	// adds the first command (`true`), second is a second one alone,
	// with the guest's translation cache warm.
	ready, firstDone, second time.Duration
	// timings are the sandbox's phases; zero for the raw boot.
	timings sandbox.BootTimings
}

// The variants the others are compared to.
const (
	rawVariant  = "raw QEMU boot"
	coldVariant = "cold create"
)

// startVariant is one way of getting a guest that answers commands.
type startVariant struct {
	name string
	// start returns a started guest's times; done releases it.
	start func(ctx context.Context) (startSample, error)
}

func benchStart(c *cli.Context) error {
	n, mgr, err := benchSandboxes(c, "ephemeral bench", 1000)
	if err != nil {
		return err
	}
	defer mgr.Shutdown()
	ctx := c.Context
	shape := sandbox.Options{MemoryMiB: c.Int("memory")}
	poolShape := shape
	poolShape.Start = sandbox.StartRestore // as the daemon's pool starts them
	pool, err := mgr.NewPool(sandbox.PoolConfig{Size: 1, Capacity: 2, Shape: poolShape})
	if err != nil {
		return err
	}
	defer pool.Close()

	var variants []startVariant
	if mgr.Driver() == "qemu" {
		variants = append(variants, startVariant{rawVariant, func(ctx context.Context) (startSample, error) {
			return startRaw(ctx, mgr, shape)
		}})
	} else {
		fmt.Fprintf(os.Stderr, "no raw baseline for the %s driver: ratios are to the cold create only\n", mgr.Driver())
	}
	viaManager := func(start sandbox.Start) func(ctx context.Context) (startSample, error) {
		return func(ctx context.Context) (startSample, error) {
			opts := shape
			opts.Start = start
			return startSandbox(ctx, func(ctx context.Context) (*sandbox.Sandbox, error) { return mgr.Create(ctx, opts) })
		}
	}
	variants = append(variants,
		startVariant{coldVariant, viaManager(sandbox.StartBoot)},
		startVariant{"restore (clone of a template)", viaManager(sandbox.StartRestore)},
		startVariant{"take from the warm pool", func(ctx context.Context) (startSample, error) {
			if err := waitPool(ctx, pool); err != nil {
				return startSample{}, err
			}
			s, err := startSandbox(ctx, func(ctx context.Context) (*sandbox.Sandbox, error) { return pool.Take(ctx, shape) })
			if err == nil && !s.timings.Pooled {
				err = errors.New("the pool had no sandbox ready")
			}
			if err != nil {
				return s, err
			}
			// The refill runs now, not during the next variant.
			return s, waitPool(ctx, pool)
		}},
	)

	fmt.Fprintf(os.Stderr, "%d rounds of %d variants with %s, after a warm-up round...\n", n, len(variants), mgr.Describe())
	pool.Start()
	samples := make([][]startSample, len(variants))
	for round := -1; round < n; round++ {
		// The order rotates, so no variant always follows the same one.
		for k := range variants {
			i := (k + max(round, 0)) % len(variants)
			ctx, cancel := context.WithTimeout(ctx, startTimeout)
			s, err := variants[i].start(ctx)
			cancel()
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", variants[i].name, round+1, err)
			}
			if round >= 0 {
				samples[i] = append(samples[i], s)
			}
		}
	}
	printStart(os.Stdout, variants, samples)
	return nil
}

// startSandbox starts a sandbox with create, runs two commands in it and
// destroys it.
func startSandbox(ctx context.Context, create func(context.Context) (*sandbox.Sandbox, error)) (startSample, error) {
	began := time.Now()
	sb, err := create(ctx)
	if err != nil {
		return startSample{}, err
	}
	defer sb.Destroy()
	s := startSample{ready: time.Since(began), timings: sb.Timings()}
	s.firstDone, s.second, err = twoCommands(ctx, began, sb.Exec)
	return s, err
}

// execFunc runs a command in a guest, as Sandbox.Exec and Client.Exec do.
type execFunc func(ctx context.Context, req vsockproto.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (vsockproto.ExitStatus, error)

// twoCommands runs `true` twice and returns when the first finished,
// counted from began, and how long the second took.
func twoCommands(ctx context.Context, began time.Time, exec execFunc) (firstDone, second time.Duration, err error) {
	run := func() error {
		st, err := exec(ctx, vsockproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("true exited %d", st.Code)
		}
		return err
	}
	if err := run(); err != nil {
		return 0, 0, err
	}
	firstDone = time.Since(began)
	secondBegan := time.Now()
	if err := run(); err != nil {
		return 0, 0, err
	}
	return firstDone, time.Since(secondBegan), nil
}

// startRaw boots the sandbox's machine with a bare QEMU (qemu.Driver's
// Baseline: no confinement, network namespace, QMP or pausing) and talks
// to its guest directly; the guest must be provisioned before it runs
// commands, as every guest.
func startRaw(ctx context.Context, mgr *sandbox.Manager, shape sandbox.Options) (startSample, error) {
	dir, err := os.MkdirTemp("", "ephemeral-bench-")
	if err != nil {
		return startSample{}, err
	}
	defer os.RemoveAll(dir)
	img := mgr.Image()
	cfg := vmm.Config{
		ID: sandboxid.New(), Kernel: img.Kernel, Initrd: img.Initrd, RootDisk: img.RootDisk,
		Cmdline: sandbox.GuestCmdline, VCPUs: 1, MemoryMiB: shape.MemoryMiB, Dir: dir,
	}
	sock := filepath.Join(dir, "guest.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return startSample{}, err
	}
	ln.SetUnlinkOnClose(false)
	serial, err := ln.File()
	ln.Close()
	if err != nil {
		return startSample{}, err
	}
	cmd, err := qemu.New("").Baseline(cfg, serial)
	if err != nil {
		serial.Close()
		return startSample{}, err
	}
	began := time.Now()
	err = cmd.Start()
	serial.Close()
	if err != nil {
		return startSample{}, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	conn, err := new(net.Dialer).DialContext(ctx, "unix", sock)
	if err != nil {
		return startSample{}, err
	}
	client := vsockproto.NewClient(conn)
	defer client.Close()
	if _, err := client.Hello(ctx); err != nil {
		return startSample{}, fmt.Errorf("raw QEMU: %w", err)
	}
	if _, err := client.Provision(ctx, sandbox.NewProvision()); err != nil {
		return startSample{}, fmt.Errorf("raw QEMU: %w", err)
	}
	s := startSample{ready: time.Since(began)}
	s.firstDone, s.second, err = twoCommands(ctx, began, client.Exec)
	return s, err
}

// waitPool waits, untimed, until the pool holds a sandbox.
func waitPool(ctx context.Context, p *sandbox.Pool) error {
	for p.Ready() == 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the pool: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// printStart writes the start benchmark's tables: each variant to ready
// and to its first command finished, with its ratios to the raw boot and to
// the cold create of the same round; the phases of the sandbox starts; the
// second command.
func printStart(out io.Writer, variants []startVariant, samples [][]startSample) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	var baselines []int // the variants the others are compared to
	for i, v := range variants {
		if v.name == rawVariant || v.name == coldVariant {
			baselines = append(baselines, i)
		}
	}
	for _, m := range []struct {
		title string
		get   func(startSample) time.Duration
	}{
		{"to ready", func(s startSample) time.Duration { return s.ready }},
		{"to first command finished", func(s startSample) time.Duration { return s.firstDone }},
	} {
		head := header(m.title)
		for _, b := range baselines {
			head += "\tratio to " + variants[b].name + " (IQR)"
		}
		fmt.Fprintln(w, head+"\t")
		for i, v := range variants {
			var xs []float64
			for _, s := range samples[i] {
				xs = append(xs, millis(m.get(s)))
			}
			row := v.name + "\t" + summarize(xs).format(fmtMillis)
			for _, b := range baselines {
				// Each round's ratio: the machine's noise of the moment
				// cancels out.
				var ratios []float64
				for r, s := range samples[i] {
					ratios = append(ratios, float64(m.get(s))/float64(m.get(samples[b][r])))
				}
				rs := summarize(ratios)
				row += fmt.Sprintf("\t%s (%s–%s)", fmtRatio(rs.median), fmtRatio(rs.p25), fmtRatio(rs.p75))
			}
			fmt.Fprintln(w, row+"\t")
		}
		fmt.Fprintln(w, "\t")
	}

	fmt.Fprintln(w, header("phases of a start (sandboxes)")+"\t")
	for i, v := range variants {
		if samples[i][0].timings.Ready == 0 {
			continue // the raw boot has none
		}
		for _, p := range []struct {
			name string
			get  func(sandbox.BootTimings) time.Duration
			show func(sandbox.BootTimings) bool
		}{
			{"network namespace", func(t sandbox.BootTimings) time.Duration { return t.Network }, notPooled},
			{"VMM start (and state load)", func(t sandbox.BootTimings) time.Duration { return t.VMMStart }, notPooled},
			{"firmware, early kernel before the guest clock", func(t sandbox.BootTimings) time.Duration { return t.Hello - t.Kernel - t.Init }, booted},
			{"guest kernel", func(t sandbox.BootTimings) time.Duration { return t.Kernel }, booted},
			{"guest init", func(t sandbox.BootTimings) time.Duration { return t.Init }, booted},
			{"guest wakes to its hello", func(t sandbox.BootTimings) time.Duration { return t.Hello }, restoredNotPooled},
			{"provision and network setup", func(t sandbox.BootTimings) time.Duration { return t.Setup }, notPooled},
		} {
			if !p.show(samples[i][0].timings) {
				continue
			}
			var xs []float64
			for _, s := range samples[i] {
				xs = append(xs, millis(p.get(s.timings)))
			}
			fmt.Fprintf(w, "%s: %s\t%s\t\n", v.name, p.name, summarize(xs).format(fmtMillis))
		}
	}
	fmt.Fprintln(w, "\t\t\t\t\t")
	fmt.Fprintln(w, header("second command (`true`, warm)")+"\t")
	for i, v := range variants {
		var xs []float64
		for _, s := range samples[i] {
			xs = append(xs, millis(s.second))
		}
		fmt.Fprintf(w, "%s\t%s\t\n", v.name, summarize(xs).format(fmtMillis))
	}
	w.Flush()
}

func notPooled(t sandbox.BootTimings) bool         { return !t.Pooled }
func booted(t sandbox.BootTimings) bool            { return !t.Restored }
func restoredNotPooled(t sandbox.BootTimings) bool { return t.Restored && !t.Pooled }
