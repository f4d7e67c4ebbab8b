package limits

import (
	"strings"
	"testing"
)

// What the host writes is what the guest reads, among the kernel's and
// the driver's own parameters.
func TestParamsRoundTrip(t *testing.T) {
	want := Limits{ScratchMiB: 300, TmpMiB: 40, OverlayMiB: 200, CommandProcesses: 99}
	cmdline := "console=ttyS0 panic=-1 cryptomgr.notests " + want.Params() + " ephemeral.unrelated=1"
	got, err := Parse(cmdline)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("Parse(%q) = %+v, want %+v", cmdline, got, want)
	}
}

func TestParseDefaultsAndErrors(t *testing.T) {
	got, err := Parse("console=ttyS0 ephemeral.tmp_mib=10")
	if want := Defaults(); err != nil || got.TmpMiB != 10 || got.ScratchMiB != want.ScratchMiB || got.CommandProcesses != want.CommandProcesses {
		t.Errorf("Parse with one limit = %+v, %v; want the others at their defaults", got, err)
	}
	for _, bad := range []string{"ephemeral.scratch_mib=", "ephemeral.scratch_mib=-1", "ephemeral.command_nproc=0", "ephemeral.tmp_mib=1e3"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := Defaults().Validate(512); err != nil {
		t.Errorf("the defaults do not fit the default 512 MiB guest: %v", err)
	}
	big := Defaults()
	big.ScratchMiB = 400
	if err := big.Validate(512); err == nil || !strings.Contains(err.Error(), "give the guest more memory") {
		t.Errorf("Validate of filesystems larger than the guest: %v", err)
	}
	if err := big.Validate(1024); err != nil {
		t.Errorf("the same filesystems in a 1 GiB guest: %v", err)
	}
	zero := Defaults()
	zero.CommandProcesses = 0
	if err := zero.Validate(512); err == nil || !strings.Contains(err.Error(), "ephemeral.command_nproc 0") {
		t.Errorf("Validate of a zero process limit: %v", err)
	}
}
