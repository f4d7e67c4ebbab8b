package vmm

import (
	"errors"
	"strings"
	"testing"
)

// cpuinfoBlock renders one processor block the way /proc/cpuinfo does.
func cpuinfoBlock(fields ...string) string {
	var b strings.Builder
	b.WriteString("processor\t: 0\n")
	for i := 0; i+1 < len(fields); i += 2 {
		b.WriteString(fields[i] + "\t\t: " + fields[i+1] + "\n")
	}
	return b.String() + "\n"
}

func TestVirtualizationFlags(t *testing.T) {
	tests := []struct {
		name    string
		cpuinfo string
		wantErr string
	}{
		{
			name:    "intel vt-x",
			cpuinfo: cpuinfoBlock("model name", "Intel(R) Xeon(R) Gold 6138 CPU @ 2.00GHz", "flags", "fpu vme de tsc msr vmx smx est"),
		},
		{
			name:    "amd-v",
			cpuinfo: cpuinfoBlock("model name", "AMD EPYC 7B13", "flags", "fpu tsc svm extapic"),
		},
		{
			// A PVM guest: everything but vmx/svm, while /dev/kvm exists.
			name:    "pvm without vmx or svm",
			cpuinfo: cpuinfoBlock("model name", "AMD EPYC", "flags", "fpu vme tsc constant_tsc tsc_known_freq hypervisor"),
			wantErr: "neither vmx nor svm",
		},
		{
			// Flag names that merely contain "vmx" must not count.
			name:    "vmx as a substring",
			cpuinfo: cpuinfoBlock("flags", "fpu vmx_ept tsc notsvm"),
			wantErr: "neither vmx nor svm",
		},
		{
			// Only the first CPU block is read; later blocks repeat it.
			name:    "flags of a later cpu ignored",
			cpuinfo: cpuinfoBlock("flags", "fpu tsc") + cpuinfoBlock("flags", "fpu tsc vmx"),
			wantErr: "neither vmx nor svm",
		},
		{
			name:    "no flags line",
			cpuinfo: cpuinfoBlock("model name", "Some CPU"),
			wantErr: "no flags line",
		},
		{
			name:    "empty",
			cpuinfo: "",
			wantErr: "no flags line",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := virtualizationFlags([]byte(tt.cpuinfo))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("virtualizationFlags: unexpected error %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("virtualizationFlags: got nil, want error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("virtualizationFlags: error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestTSCKHzFromCPUInfo(t *testing.T) {
	tests := []struct {
		name    string
		cpuinfo string
		want    int
		wantErr bool
	}{
		{
			// The hypervisor told the kernel the TSC rate: cpu MHz is exact.
			name:    "known frequency in a vm",
			cpuinfo: cpuinfoBlock("model name", "AMD EPYC", "cpu MHz", "2596.146", "flags", "fpu tsc constant_tsc tsc_known_freq"),
			want:    2596146,
		},
		{
			// On bare metal cpu MHz is the scaled clock; the nominal
			// frequency in the model name is the TSC rate.
			name:    "intel nominal beats scaled clock",
			cpuinfo: cpuinfoBlock("model name", "Intel(R) Xeon(R) Gold 6138 CPU @ 2.00GHz", "cpu MHz", "799.932", "flags", "fpu tsc constant_tsc"),
			want:    2000000,
		},
		{
			name:    "cpu MHz as the last resort",
			cpuinfo: cpuinfoBlock("model name", "AMD EPYC 7B13", "cpu MHz", "3000.000", "flags", "fpu tsc"),
			want:    3000000,
		},
		{
			name:    "garbage cpu MHz",
			cpuinfo: cpuinfoBlock("model name", "AMD EPYC", "cpu MHz", "fast", "flags", "fpu tsc"),
			wantErr: true,
		},
		{
			name:    "no tsc",
			cpuinfo: cpuinfoBlock("cpu MHz", "1000.000", "flags", "fpu"),
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tscKHzFromCPUInfo([]byte(tt.cpuinfo))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("tscKHzFromCPUInfo = %d, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("tscKHzFromCPUInfo: %v", err)
			}
			if got != tt.want {
				t.Fatalf("tscKHzFromCPUInfo = %d kHz, want %d kHz", got, tt.want)
			}
		})
	}
}

// The probes of the real host: /proc/cpuinfo and /dev/kvm plumbing, not
// the parsers.
func TestHostProbes(t *testing.T) {
	err := HardwareKVM()
	t.Logf("HardwareKVM: %v", err)
	if err != nil && !errors.Is(err, ErrNoHardwareKVM) {
		t.Fatalf("HardwareKVM error %q does not wrap ErrNoHardwareKVM", err)
	}
	khz, err := HostTSCKHz()
	if err != nil {
		t.Fatalf("HostTSCKHz: %v", err)
	}
	// Any x86 CPU of this century: between 500 MHz and 10 GHz.
	if khz < 500_000 || khz > 10_000_000 {
		t.Fatalf("HostTSCKHz = %d kHz, outside any plausible TSC rate", khz)
	}
}
