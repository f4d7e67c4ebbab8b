package initd

import (
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/guest/limits"
)

// Every filesystem the guest can write is sized: the tmpfs of RootMounts
// by the limits, the overlay and the scratch directory by their own.
func TestEveryRootTmpfsIsSized(t *testing.T) {
	sized := WithSizes(RootMounts, RootMountSizes(limits.Limits{TmpMiB: 77}))
	for i, m := range sized {
		if m.FSType != "tmpfs" {
			if m.Data != RootMounts[i].Data {
				t.Errorf("%s (%s): data changed to %q", m.Target, m.FSType, m.Data)
			}
			continue
		}
		if !strings.Contains(m.Data, ",size=") {
			t.Errorf("tmpfs %s has no size: %q", m.Target, m.Data)
		}
	}
	if sized[2].Target != "/tmp" || sized[2].Data != "mode=1777,size=77m" {
		t.Errorf("/tmp mount %+v, want mode=1777,size=77m", sized[2])
	}
	if RootMounts[2].Data != "mode=1777" {
		t.Errorf("WithSizes changed the table itself: %q", RootMounts[2].Data)
	}
}

func TestScratchMount(t *testing.T) {
	m := ScratchMount("/tmp/ephemeral-run-abc/scratch", 128, 1000, 1000)
	if m.FSType != "tmpfs" || m.Target != "/tmp/ephemeral-run-abc/scratch" || m.Data != "size=128m,mode=0755,uid=1000,gid=1000" {
		t.Errorf("ScratchMount = %+v", m)
	}
}
