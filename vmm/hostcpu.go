package vmm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// HostTSCKHz estimates the host's TSC frequency in kHz. Under KVM the guest
// TSC runs at the host's rate, and under QEMU TCG rdtsc reads the host TSC,
// so this is also the guest's TSC frequency. Drivers pass it as
// tsc_early_khz: on machines without a legacy timer to calibrate against
// (QEMU microvm), the guest kernel's own calibration can hang.
func HostTSCKHz() (int, error) {
	// Some kernels export the frequency they calibrated; it is the best
	// source when present.
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if khz, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && khz > 0 {
			return khz, nil
		}
	}
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0, fmt.Errorf("host tsc frequency: %w", err)
	}
	khz, err := tscKHzFromCPUInfo(cpuinfo)
	if err != nil {
		return 0, fmt.Errorf("host tsc frequency: %w", err)
	}
	return khz, nil
}

// nominalGHz matches the base frequency Intel puts in the model name
// ("Intel(R) Xeon(R) Gold 6138 CPU @ 2.00GHz"), which is the TSC rate on
// CPUs with an invariant TSC.
var nominalGHz = regexp.MustCompile(`@ *([0-9]+(?:\.[0-9]+)?) *GHz`)

// tscKHzFromCPUInfo picks the most trustworthy TSC frequency in cpuinfo
// text: "cpu MHz" when the kernel was told the TSC frequency
// (tsc_known_freq, typical in VMs, where the value is exact), then the
// nominal frequency in the model name, then "cpu MHz" as an approximation
// (on bare metal it is the current, scaled clock).
func tscKHzFromCPUInfo(cpuinfo []byte) (int, error) {
	flags, _ := firstCPUField(cpuinfo, "flags")
	if !hasFlag(flags, "tsc") {
		return 0, errors.New("the CPU has no tsc flag")
	}
	mhz, haveMHz := cpuMHz(cpuinfo)
	if haveMHz && hasFlag(flags, "tsc_known_freq") {
		return mhz, nil
	}
	if model, ok := firstCPUField(cpuinfo, "model name"); ok {
		if m := nominalGHz.FindStringSubmatch(model); m != nil {
			ghz, err := strconv.ParseFloat(m[1], 64)
			if err == nil && ghz > 0 && ghz < 100 {
				return int(ghz * 1e6), nil
			}
		}
	}
	if haveMHz {
		return mhz, nil
	}
	return 0, errors.New("no cpu MHz or nominal frequency in /proc/cpuinfo")
}

func cpuMHz(cpuinfo []byte) (khz int, ok bool) {
	value, ok := firstCPUField(cpuinfo, "cpu MHz")
	if !ok {
		return 0, false
	}
	mhz, err := strconv.ParseFloat(value, 64)
	if err != nil || mhz <= 0 || mhz > 100e3 {
		return 0, false
	}
	return int(mhz * 1e3), true
}

func hasFlag(flags, want string) bool {
	for _, flag := range strings.Fields(flags) {
		if flag == want {
			return true
		}
	}
	return false
}

// firstCPUField returns the value of "key : value" in the first processor
// block of cpuinfo text. Blocks are separated by blank lines.
func firstCPUField(cpuinfo []byte, key string) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	// A flags line with every x86 feature is a few KiB; leave headroom.
	sc.Buffer(make([]byte, 0, 16<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(name) == key {
			return strings.TrimSpace(value), true
		}
	}
	return "", false
}
