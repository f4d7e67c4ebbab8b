package sandbox

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/guest/image"
	"github.com/ephemeralhq/ephemeral/guest/limits"
	"github.com/ephemeralhq/ephemeral/netns"
)

func TestOptionsValidation(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Network: netns.Config{Mode: netns.Broker}}, "broker config without a port"},
		{Options{Network: netns.Config{Mode: netns.Sealed, BrokerPort: 80}}, "sealed config with broker port"},
	} {
		_, err := tc.opts.withDefaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.opts, err, tc.want)
		}
	}
	got, err := (&Options{}).withDefaults()
	if err != nil || got.VCPUs != 1 || got.MemoryMiB != 512 || got.Network.Mode != netns.Sealed {
		t.Errorf("defaults: %+v, %v", got, err)
	}
}

// Create checks the machine it would boot, by vmm.Config's bounds, before
// it builds anything.
func TestCreateRejectsBadResourcesFirst(t *testing.T) {
	m := &Manager{
		image:  &image.Image{Kernel: "/images/vmlinuz", Initrd: "/images/initrd", RootDisk: "/images/root.ext4"},
		dir:    t.TempDir(),
		live:   make(map[string]*Sandbox),
		limits: DefaultLimits(),
	}
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{VCPUs: 17}, "vcpus 17 out of range"},
		{Options{VCPUs: -1}, "vcpus -1 out of range"},
		{Options{MemoryMiB: 64}, "memory 64 MiB out of range"},
		// The guest's filesystems, at their default sizes, fill a 256 MiB
		// guest's RAM.
		{Options{MemoryMiB: 256}, "give the guest more memory"},
	} {
		sb, err := m.Create(context.Background(), tc.opts)
		if err == nil {
			sb.Destroy()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Create(%+v) = %v, want an error containing %q", tc.opts, err, tc.want)
		}
	}
	if entries, err := os.ReadDir(m.dir); err != nil || len(entries) != 0 {
		t.Errorf("the rejected sandboxes left %v in their state directory (%v)", entries, err)
	}
}

// Limits a configuration leaves unset take their defaults; those it sets
// stay.
func TestLimitsDefaults(t *testing.T) {
	got := Limits{VMMOverheadMiB: 300, Guest: limits.Limits{TmpMiB: 32}}.withDefaults()
	want := DefaultLimits()
	want.VMMOverheadMiB, want.Guest.TmpMiB = 300, 32
	if got != want {
		t.Errorf("withDefaults() = %+v, want %+v", got, want)
	}
}
