package sandbox

import (
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/netns"
)

func TestIDShape(t *testing.T) {
	id, err := newID()
	if err != nil {
		t.Fatal(err)
	}
	if !isID(id) {
		t.Errorf("newID gave %q, which isID refuses", id)
	}
	for _, bad := range []string{"", "test-0a1b2c3d4e5f", "0A1B2C3D4E5F", "0a1b2c3d4e5", "0a1b2c3d4e5f00", "0a1b2c3d4e5g"} {
		if isID(bad) {
			t.Errorf("isID(%q) = true", bad)
		}
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{VCPUs: 17}, "vcpus 17 out of range"},
		{Options{MemoryMiB: 64}, "memory 64 MiB out of range"},
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
