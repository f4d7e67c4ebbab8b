package vmm

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
)

func validConfig() Config {
	return Config{
		ID:        sandboxid.New(),
		Kernel:    "/images/vmlinuz",
		Initrd:    "/images/initrd",
		RootDisk:  "/images/root.ext4",
		VCPUs:     1,
		MemoryMiB: 512,
		Dir:       "/var/lib/ephemeral/sandboxes/0a1b2c3d4e5f/vm",
	}
}

func TestValidateAcceptsTheBounds(t *testing.T) {
	for _, mutate := range []func(*Config){
		func(*Config) {},
		func(c *Config) { c.VCPUs, c.MemoryMiB = MinVCPUs, MinMemoryMiB },
		func(c *Config) { c.VCPUs, c.MemoryMiB = MaxVCPUs, MaxMemoryMiB },
		func(c *Config) { c.Dir = "/" + strings.Repeat("d", MaxDirLen-1) },
		func(c *Config) { c.Tap, c.MAC = os.Stdin, net.HardwareAddr{2, 0, 0, 0, 0, 1} },
	} {
		c := validConfig()
		mutate(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", c, err)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"id not a sandbox id", func(c *Config) { c.ID = "a,b" }, "id"},
		{"empty id", func(c *Config) { c.ID = "" }, "id"},
		{"relative kernel", func(c *Config) { c.Kernel = "vmlinuz" }, "kernel path"},
		{"no initrd", func(c *Config) { c.Initrd = "" }, "initrd path"},
		{"no root disk", func(c *Config) { c.RootDisk = "" }, "root disk path"},
		{"no dir", func(c *Config) { c.Dir = "" }, "dir path"},
		{"dir too long", func(c *Config) { c.Dir = "/" + strings.Repeat("d", MaxDirLen) }, "longer than"},
		{"no vcpus", func(c *Config) { c.VCPUs = 0 }, "vcpus 0"},
		{"too many vcpus", func(c *Config) { c.VCPUs = MaxVCPUs + 1 }, "vcpus 17"},
		{"tiny memory", func(c *Config) { c.MemoryMiB = 64 }, "memory 64 MiB"},
		{"huge memory", func(c *Config) { c.MemoryMiB = MaxMemoryMiB + 1 }, "memory 16385 MiB"},
		{"tap without mac", func(c *Config) { c.Tap = os.Stdin }, "mac"},
		{"mac without tap", func(c *Config) { c.MAC = net.HardwareAddr{2, 0, 0, 0, 0, 1} }, "mac set without a tap"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	err := Config{}.Validate()
	if err == nil {
		t.Fatal("the zero Config validated")
	}
	for _, want := range []string{"id", "kernel", "initrd", "root disk", "dir", "vcpus", "memory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, which does not mention %s", err, want)
		}
	}
}
