package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemeralhq/ephemeral/guest/image"
	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vmm"
)

// Start says how Create gets a sandbox's VM going.
type Start int

const (
	// StartAuto restores a clone of a template where the driver can save
	// VMs (and the Manager does not start cold, Config.ColdStarts), and
	// boots the VM otherwise, or while the template cannot be built.
	StartAuto Start = iota
	// StartBoot boots the guest kernel: a cold start.
	StartBoot
	// StartRestore restores a clone and fails where that is impossible.
	StartRestore
)

// Templates. A template is a VM booted up to the point where its guest
// init waits for its first host connection, then saved (vmm.Snapshotter);
// every sandbox of the same image and shape can then start as a clone of
// it, which skips the boot. One is built per image and shape when first
// needed, and shared; a new image retires the old image's templates.
// The host makes each clone unique (see vsockproto.Provision), so a clone
// is as fresh as a booted VM.
const (
	// templateBootTimeout bounds the boot and saving of one template.
	templateBootTimeout = 2 * time.Minute
	// templateRetry is how long after a failed template Create boots
	// sandboxes (under StartAuto) before it tries another template.
	templateRetry = time.Minute
	// templateMaxAge is how long a template serves before a fresh one is
	// booted. Provisioning makes every clone unique in all a guest can
	// use to tell clones apart, but what the kernel drew for itself at
	// boot (hash table seeds, for one) is the template's; a template's
	// clones share it for at most this long.
	templateMaxAge = time.Hour
)

// templateKey names a template: the image and the shape it was booted
// with.
type templateKey struct {
	image            string
	vcpus, memoryMiB int
}

func keyOf(img *image.Image, opts Options) templateKey {
	return templateKey{image: img.Hash, vcpus: opts.VCPUs, memoryMiB: opts.MemoryMiB}
}

// templateSlot is one key's template, built once, shared by the clones
// started from it, and closed when it is retired and no start uses it.
type templateSlot struct {
	done chan struct{} // closed once t or err is set
	t    vmm.Template
	err  error
	// builtAt is when t or err was set: a failed slot is rebuilt after
	// templateRetry, a template after templateMaxAge.
	builtAt time.Time
	// release removes what the template holds besides t: its directory
	// and the directory's lock.
	release func()

	// Guarded by templates.mu: the starts using t, whether the slot was
	// retired (by a new image or Shutdown), and whether t was closed,
	// which happens once it is retired and unused.
	users   int
	retired bool
	closed  bool
}

// templates is the Manager's templates.
type templates struct {
	mu    sync.Mutex
	slots map[templateKey]*templateSlot
	// builds are the goroutines building templates; Shutdown waits.
	builds sync.WaitGroup
	// stopping is closed by Shutdown: builds stop, no new one starts.
	stopping chan struct{}
	stopped  bool
}

func newTemplates() templates {
	return templates{slots: make(map[templateKey]*templateSlot), stopping: make(chan struct{})}
}

// startFunc picks how Create starts a VM of opts' shape from img.
func (m *Manager) startFunc(img *image.Image, opts Options) (startFunc, error) {
	snap, canSave := m.driver.(vmm.Snapshotter)
	switch {
	case opts.Start == StartBoot, opts.Start == StartAuto && (!canSave || m.coldStarts):
		return m.boot, nil
	case !canSave:
		return nil, fmt.Errorf("sandbox: the %s driver cannot restore VMs", m.driver.Name())
	}
	// The template is taken only here, when the clone starts, so that a
	// Create that fails before holds none.
	return func(ctx context.Context, cfg vmm.Config) (vmm.Machine, bool, error) {
		t, release, err := m.template(ctx, img, opts)
		if err != nil {
			if opts.Start == StartRestore || ctx.Err() != nil {
				return nil, false, err
			}
			return m.boot(ctx, cfg)
		}
		defer release()
		machine, err := snap.Restore(ctx, t, cfg)
		return machine, true, err
	}, nil
}

// template returns the template for img and opts' shape, building it if
// there is none, and a release the caller must call once it has started
// its clone. It fails at once, for templateRetry, after a build failed.
func (m *Manager) template(ctx context.Context, img *image.Image, opts Options) (vmm.Template, func(), error) {
	key := keyOf(img, opts)
	ts := &m.templates
	ts.mu.Lock()
	if ts.stopped {
		ts.mu.Unlock()
		return nil, nil, ErrShuttingDown
	}
	slot := ts.slots[key]
	var expired *templateSlot
	if slot != nil && slot.expired() {
		delete(ts.slots, key)
		slot.retired = true
		expired, slot = slot, nil
	}
	if slot == nil {
		slot = &templateSlot{done: make(chan struct{})}
		ts.slots[key] = slot
		ts.builds.Add(1)
		go func() {
			defer ts.builds.Done()
			m.buildTemplate(slot, img, opts)
		}()
	}
	ts.mu.Unlock()
	if expired != nil {
		m.closeIfUnused(expired)
	}

	select {
	case <-slot.done:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("sandbox: wait for the template: %w", ctx.Err())
	}
	if slot.err != nil {
		return nil, nil, slot.err
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if slot.closed {
		return nil, nil, errors.New("sandbox: the template was retired")
	}
	slot.users++
	return slot.t, sync.OnceFunc(func() { m.releaseTemplate(slot) }), nil
}

// expired reports whether a built slot is due for replacement: a failure
// older than templateRetry, a template older than templateMaxAge. The
// caller holds templates.mu.
func (slot *templateSlot) expired() bool {
	select {
	case <-slot.done:
	default:
		return false // still building
	}
	if slot.err != nil {
		return time.Since(slot.builtAt) > templateRetry
	}
	return time.Since(slot.builtAt) > templateMaxAge
}

// buildTemplate boots and saves slot's template. A failure is logged,
// and Create boots sandboxes instead for a while.
func (m *Manager) buildTemplate(slot *templateSlot, img *image.Image, opts Options) {
	ctx, cancel := context.WithTimeout(context.Background(), templateBootTimeout)
	defer cancel()
	// Shutdown cancels the build.
	built, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-m.templates.stopping:
			cancel()
		case <-built:
		}
	}()
	defer func() { close(built); <-watched }()
	began := time.Now()
	slot.t, slot.release, slot.err = m.snapshot(ctx, img, opts)
	slot.builtAt = time.Now()
	if slot.err != nil {
		m.logf("sandbox: no template for %d vcpus and %d MiB (sandboxes boot instead for %v): %v", opts.VCPUs, opts.MemoryMiB, templateRetry, slot.err)
	} else {
		m.logf("sandbox: template for %d vcpus and %d MiB of image %s saved in %v", opts.VCPUs, opts.MemoryMiB, img.Hash, time.Since(began).Round(time.Millisecond))
	}
	close(slot.done)
	// Retired while it was being built: closed now unless a start
	// already holds it.
	m.closeIfUnused(slot)
}

// snapshot boots a VM like a sandbox's, with a sealed network of its own
// (a clone's device set must be the template's), and saves it. The
// template keeps its directory, locked like a sandbox's so that
// reconciliation sweeps it after a crash, until release.
func (m *Manager) snapshot(ctx context.Context, img *image.Image, opts Options) (vmm.Template, func(), error) {
	snap := m.driver.(vmm.Snapshotter)
	id := sandboxid.New()
	dir := filepath.Join(m.dir, id)
	cfg := m.vmConfig(img, opts, id, dir)
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("sandbox: template: %w", err)
	}
	var undo cleanup.Stack
	defer undo.Run()
	lock, err := m.makeOwnedDir(dir)
	if err != nil {
		return nil, nil, err
	}
	release := func() { os.RemoveAll(dir); lock.Close() }
	undo.Add(release)
	// The template's VMM runs in a cgroup of its own with a sandbox's
	// limits, like every VMM, for as long as it runs: it is gone once the
	// template is saved, and what it saved is the daemon's to hold (QEMU's
	// RAM memfd is charged to the daemon's own group: see vmm/qemu's
	// snapshot.go).
	group, err := m.confine(id, opts)
	if err != nil {
		return nil, nil, err
	}
	if group != nil {
		defer func() {
			if err := group.Remove(); err != nil {
				m.logf("sandbox: template %s: %v", id, err)
			}
		}()
		cfg.Cgroup = group
	}
	// Registered while its network exists, which Reconcile spares then.
	if err := m.register(id, nil); err != nil {
		return nil, nil, err
	}
	defer m.unregister(id)
	network, err := netns.Create(ctx, id, netns.Config{Mode: netns.Sealed})
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: template network: %w", err)
	}
	// The saved VM keeps nothing of its network: a clone gets a tap of
	// its own.
	defer network.Close()
	if err := os.Mkdir(cfg.Dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("sandbox: create template vm dir: %w", err)
	}
	cfg.Tap, cfg.MAC = network.Tap(), network.MAC()
	t, err := snap.Snapshot(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: template: %w", err)
	}
	undo.Release()
	return t, release, nil
}

// releaseTemplate ends one use of slot's template.
func (m *Manager) releaseTemplate(slot *templateSlot) {
	m.templates.mu.Lock()
	slot.users--
	m.templates.mu.Unlock()
	m.closeIfUnused(slot)
}

// retireTemplates drops the templates keep rejects, built or being built;
// each is closed once no start uses it.
func (m *Manager) retireTemplates(keep func(templateKey) bool) {
	var retired []*templateSlot
	ts := &m.templates
	ts.mu.Lock()
	for key, slot := range ts.slots {
		if !keep(key) {
			delete(ts.slots, key)
			slot.retired = true
			retired = append(retired, slot)
		}
	}
	ts.mu.Unlock()
	for _, slot := range retired {
		m.closeIfUnused(slot)
	}
}

// closeIfUnused closes slot's template if it is built, retired and used by
// no start, unless that was done already.
func (m *Manager) closeIfUnused(slot *templateSlot) {
	select {
	case <-slot.done:
	default:
		return // its build closes it when done
	}
	m.templates.mu.Lock()
	closeNow := slot.retired && slot.users == 0 && !slot.closed && slot.t != nil
	if closeNow {
		slot.closed = true
	}
	m.templates.mu.Unlock()
	if !closeNow {
		return
	}
	if err := slot.t.Close(); err != nil {
		m.logf("sandbox: close template: %v", err)
	}
	slot.release()
}

// stopTemplates stops template builds, waits for them and closes every
// template; clones already started run on.
func (m *Manager) stopTemplates() {
	ts := &m.templates
	ts.mu.Lock()
	if !ts.stopped {
		ts.stopped = true
		close(ts.stopping)
	}
	ts.mu.Unlock()
	ts.builds.Wait()
	m.retireTemplates(func(templateKey) bool { return false })
}

// currentImage is the state directory's current guest image. When it has
// changed since the last call (`ephemeral image build`), sandboxes start
// from the new one and the old image's templates are retired.
func (m *Manager) currentImage() (*image.Image, error) {
	if m.stateDir == "" {
		return m.image, nil
	}
	img, err := image.Load(m.stateDir)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	changed := img.Hash != m.image.Hash
	if changed {
		m.image = img
	}
	m.mu.Unlock()
	if changed {
		m.logf("sandbox: the guest image changed to %s; new sandboxes start from it", img.Hash)
		m.retireTemplates(func(k templateKey) bool { return k.image == img.Hash })
	}
	return img, nil
}
