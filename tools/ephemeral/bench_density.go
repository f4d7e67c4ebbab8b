package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat on Linux.
const userHZ = 100

// probeExecs is how many `true` round trips measure the host's
// responsiveness.
const probeExecs = 7

// densitySample is what one idle sandbox costs.
type densitySample struct {
	pssMiB, cpuPercent float64
	// guestUsedMiB is what the guest uses as free(1) counts it;
	// guestCacheMiB is its buffers and page cache on top.
	guestUsedMiB, guestCacheMiB float64
}

func benchDensity(c *cli.Context) error {
	n, mgr, err := benchSandboxes(c, "ephemeral bench density", 10000)
	if err != nil {
		return err
	}
	defer mgr.Shutdown()
	ctx := c.Context
	opts := sandbox.Options{MemoryMiB: c.Int("memory"), Start: sandbox.StartRestore}
	how := "restored from a template"
	if c.Bool("boot") {
		opts.Start, how = sandbox.StartBoot, "booted"
	}
	fmt.Fprintf(os.Stderr, "starting %d sandboxes (%s) with %s...\n", n, how, mgr.Describe())
	availableBefore, err := memAvailableMiB()
	if err != nil {
		return err
	}

	var sandboxes []*sandbox.Sandbox
	defer func() {
		for _, sb := range sandboxes {
			sb.Destroy()
		}
	}()
	var firstStart, lastStart time.Duration
	var execAlone float64
	for i := range n {
		began := time.Now()
		startCtx, cancel := context.WithTimeout(ctx, startTimeout)
		sb, err := mgr.Create(startCtx, opts)
		cancel()
		if err != nil {
			return fmt.Errorf("sandbox %d of %d: %w", i+1, n, err)
		}
		sandboxes = append(sandboxes, sb)
		lastStart = time.Since(began)
		if i == 0 {
			firstStart = lastStart
			if execAlone, err = execLatency(ctx, sb); err != nil {
				return err
			}
		}
	}
	execLoaded, err := execLatency(ctx, sandboxes[0])
	if err != nil {
		return err
	}

	fmt.Fprintf(os.Stderr, "holding them idle: %v to settle, %v measured...\n", c.Duration("settle"), c.Duration("interval"))
	if err := sleep(ctx, c.Duration("settle")); err != nil {
		return err
	}
	samples := make([]densitySample, len(sandboxes))
	cpuBefore := make([]float64, len(sandboxes))
	for i, sb := range sandboxes {
		if cpuBefore[i], err = cpuSeconds(sb.PID()); err != nil {
			return err
		}
	}
	began := time.Now()
	if err := sleep(ctx, c.Duration("interval")); err != nil {
		return err
	}
	elapsed := time.Since(began).Seconds()
	for i, sb := range sandboxes {
		cpu, err := cpuSeconds(sb.PID())
		if err != nil {
			return err
		}
		samples[i].cpuPercent = 100 * (cpu - cpuBefore[i]) / elapsed
		if samples[i].pssMiB, err = pssMiB(sb.PID()); err != nil {
			return err
		}
	}
	availableAfter, err := memAvailableMiB()
	if err != nil {
		return err
	}
	// Last, as it wakes the guests.
	for i, sb := range sandboxes {
		if samples[i].guestUsedMiB, samples[i].guestCacheMiB, err = guestMemory(ctx, sb); err != nil {
			return err
		}
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "%d idle sandboxes (%s, %d MiB guests), each after %v idle\t\t\t\t\t\n", n, how, opts.MemoryMiB, c.Duration("settle"))
	fmt.Fprintln(w, header("per sandbox"))
	row := func(name string, get func(densitySample) float64, f func(float64) string) {
		var xs []float64
		for _, s := range samples {
			xs = append(xs, get(s))
		}
		fmt.Fprintf(w, "%s\t%s\t\n", name, summarize(xs).format(f))
	}
	row("VMM PSS", func(s densitySample) float64 { return s.pssMiB }, fmtMiB)
	row("guest used (as free(1) counts)", func(s densitySample) float64 { return s.guestUsedMiB }, fmtMiB)
	row("guest buffers and cache", func(s densitySample) float64 { return s.guestCacheMiB }, fmtMiB)
	row("PSS − guest used", func(s densitySample) float64 { return s.pssMiB - s.guestUsedMiB }, fmtMiB)
	row("idle CPU (of one core)", func(s densitySample) float64 { return s.cpuPercent }, fmtPercent)
	w.Flush()
	fmt.Printf("host memory available: %.0f MiB before, %.0f MiB with them (%.1f MiB each, templates included)\n",
		availableBefore, availableAfter, (availableBefore-availableAfter)/float64(n))
	fmt.Printf("responsiveness: a `true` round trip takes %s with 1 sandbox, %s with %d (ratio %.2f); the first start took %v, the last %v\n",
		fmtMillis(execAlone), fmtMillis(execLoaded), n, execLoaded/execAlone, firstStart.Round(time.Millisecond), lastStart.Round(time.Millisecond))
	return nil
}

// execLatency is the median round trip of `true` in sb, in milliseconds.
func execLatency(ctx context.Context, sb *sandbox.Sandbox) (float64, error) {
	var xs []float64
	for range probeExecs {
		began := time.Now()
		st, err := sb.Exec(ctx, vsockproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("true exited %d", st.Code)
		}
		if err != nil {
			return 0, err
		}
		xs = append(xs, millis(time.Since(began)))
	}
	return summarize(xs).median, nil
}

// guestMemory reads the guest's /proc/meminfo: what it uses and what it
// caches, in MiB, the way free(1) splits them.
func guestMemory(ctx context.Context, sb *sandbox.Sandbox) (used, cache float64, err error) {
	var out bytes.Buffer
	st, err := sb.Exec(ctx, vsockproto.ExecRequest{Argv: []string{"cat", "/proc/meminfo"}}, nil, &out, nil)
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("cat /proc/meminfo exited %d", st.Code)
	}
	if err != nil {
		return 0, 0, err
	}
	kb, err := parseKB(out.Bytes(), "MemTotal", "MemFree", "Buffers", "Cached")
	if err != nil {
		return 0, 0, fmt.Errorf("guest meminfo: %w", err)
	}
	cacheKB := kb["Buffers"] + kb["Cached"] + kb["SReclaimable"]
	return float64(kb["MemTotal"]-kb["MemFree"]-cacheKB) / 1024, float64(cacheKB) / 1024, nil
}

// parseKB parses "Name: value kB" lines, as /proc/meminfo and
// smaps_rollup have them, and checks that the names in want are there.
func parseKB(data []byte, want ...string) (map[string]int64, error) {
	kb := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		kb[name] = v
	}
	for _, name := range want {
		if _, ok := kb[name]; !ok {
			return nil, fmt.Errorf("no %s", name)
		}
	}
	return kb, sc.Err()
}

func memAvailableMiB() (float64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	kb, err := parseKB(data, "MemAvailable")
	if err != nil {
		return 0, fmt.Errorf("/proc/meminfo: %w", err)
	}
	return float64(kb["MemAvailable"]) / 1024, nil
}

// pssMiB is process pid's proportional set size: its private memory plus
// its share of what it maps with other processes.
func pssMiB(pid int) (float64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	kb, err := parseKB(data, "Pss")
	if err != nil {
		return 0, fmt.Errorf("pid %d: smaps_rollup: %w", pid, err)
	}
	return float64(kb["Pss"]) / 1024, nil
}

// cpuSeconds is the user and system CPU time process pid has used.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces.
	i := bytes.LastIndexByte(data, ')')
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("pid %d: short stat line", pid)
	}
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("pid %d: stat: %q %q", pid, fields[11], fields[12])
	}
	return (utime + stime) / userHZ, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
