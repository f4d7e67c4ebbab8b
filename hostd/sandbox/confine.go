package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ephemeralhq/ephemeral/guest/limits"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cgroup"
)

// Limits bound what each sandbox may use: of the host, through its VMM's
// cgroup, and inside its guest.
type Limits struct {
	// VMMOverheadMiB is the memory a VMM may use beyond its guest's RAM
	// (device emulation, TCG's translation cache, page tables, the page
	// cache of the files it reads): its cgroup's memory limit is the
	// guest's RAM plus this.
	VMMOverheadMiB int
	// Guest are the guest's own limits: its filesystems' sizes and its
	// commands' processes.
	Guest limits.Limits
}

// DefaultLimits are the limits of a Manager whose Config sets none.
func DefaultLimits() Limits {
	return Limits{VMMOverheadMiB: vmm.DefaultMemoryOverheadMiB, Guest: limits.Defaults()}
}

// withDefaults fills l's unset fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	for _, f := range []struct{ v, def *int }{
		{&l.VMMOverheadMiB, &d.VMMOverheadMiB},
		{&l.Guest.ScratchMiB, &d.Guest.ScratchMiB},
		{&l.Guest.TmpMiB, &d.Guest.TmpMiB},
		{&l.Guest.OverlayMiB, &d.Guest.OverlayMiB},
		{&l.Guest.CommandProcesses, &d.Guest.CommandProcesses},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	return l
}

// Each VMM's cgroup besides its CPU and memory limits.
const (
	// vmmTasks bounds a VMM's processes and threads. QEMU under TCG runs
	// 5 to 7 threads for a 1-vCPU guest (measured); its block I/O thread
	// pool may add up to 64 under load, and each vCPU is a thread.
	vmmTasks = 256
	// vmmIOWeight gives every VMM the same share of block I/O: v2's
	// default weight.
	vmmIOWeight = 100
)

// detectCgroups finds the host's cgroups for the VMMs. Without them VMMs
// still run, unconfined, and Describe says why.
func detectCgroups() (*cgroup.Hierarchy, string) {
	h, err := cgroup.Detect(cgroup.DefaultSubtree)
	if err != nil {
		return nil, err.Error()
	}
	return h, ""
}

// describeCgroups says how VMMs are confined by cgroups here.
func (m *Manager) describeCgroups() string {
	if m.cgroups == nil {
		return "no cgroup limits: " + m.noCgroups
	}
	return m.cgroups.String()
}

// confine creates the cgroup of sandbox id's VMM: a CPU quota of its
// vCPUs, a memory limit of its RAM plus the VMM's overhead, and a bound on
// its tasks. It returns nil where the host has no cgroups for VMMs.
func (m *Manager) confine(id string, opts Options) (*cgroup.Group, error) {
	if m.cgroups == nil {
		return nil, nil
	}
	g, err := m.cgroups.Create(id, cgroup.Limits{
		CPUs:        opts.VCPUs,
		MemoryBytes: int64(opts.MemoryMiB+m.limits.VMMOverheadMiB) << 20,
		Tasks:       vmmTasks,
		IOWeight:    vmmIOWeight,
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return g, nil
}

// reconcileCgroups removes the cgroups of sandboxes whose owner died.
func (m *Manager) reconcileCgroups(ctx context.Context) error {
	if m.cgroups == nil {
		return nil
	}
	swept, err := m.cgroups.Reconcile(ctx, m.isLive)
	for _, id := range swept {
		m.logf("sandbox: reconciled leftover cgroup of %s", id)
	}
	return err
}

// Cgroup is the group confining the sandbox's VMM, nil where the host has
// none.
func (s *Sandbox) Cgroup() *cgroup.Group { return s.cgroup }

// ErrVMMOutOfMemory says that the kernel killed a sandbox's VMM for
// passing its cgroup's memory limit.
var ErrVMMOutOfMemory = errors.New("its VMM passed its memory limit and the kernel killed it")

// StopCause says why the VM stopped, once Done is closed, where the host
// can tell: ErrVMMOutOfMemory (wrapped, with the limit), or nil.
func (s *Sandbox) StopCause() error {
	select {
	case <-s.machine.Done():
	default:
		return nil
	}
	if s.cgroup == nil {
		return nil
	}
	if kills, err := s.cgroup.OOMKills(); err == nil && kills > 0 {
		return fmt.Errorf("%w (%d MiB: the guest's RAM and %d MiB for the VMM)", ErrVMMOutOfMemory,
			s.cgroup.Limits().MemoryBytes>>20, s.m.limits.VMMOverheadMiB)
	}
	return nil
}
