package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/guest/image"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cgroup"
)

// fakeSnapshotter saves templates without booting anything; it counts
// them, and fails while fail is set.
type fakeSnapshotter struct {
	mu     sync.Mutex
	saved  []*fakeSaved
	fail   error
	images []string // the kernel each template was booted with
	// during, when set, is called with each template's Config while it
	// is being saved.
	during func(vmm.Config)
}

type fakeSaved struct {
	cfg    vmm.Config
	closed int
}

func (t *fakeSaved) Config() vmm.Config { return t.cfg }
func (t *fakeSaved) Close() error       { t.closed++; return nil }

func (d *fakeSnapshotter) Name() string { return "fake" }
func (d *fakeSnapshotter) Start(context.Context, vmm.Config) (vmm.Machine, error) {
	return nil, errors.New("fake: no booting")
}
func (d *fakeSnapshotter) Restore(context.Context, vmm.Template, vmm.Config) (vmm.Machine, error) {
	return nil, errors.New("fake: no restoring")
}
func (d *fakeSnapshotter) Snapshot(_ context.Context, cfg vmm.Config) (vmm.Template, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	if d.during != nil {
		d.during(cfg)
	}
	t := &fakeSaved{cfg: cfg}
	d.saved = append(d.saved, t)
	d.images = append(d.images, cfg.Kernel)
	return t, nil
}

// writeImage makes stateDir's current image the one whose parts are
// named by suffix.
func writeImage(t *testing.T, stateDir, suffix string) {
	t.Helper()
	dir := filepath.Join(stateDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	img := image.Image{
		Hash:     "hash-" + suffix,
		Kernel:   filepath.Join(dir, "kernel-"+suffix),
		Initrd:   filepath.Join(dir, "initrd-"+suffix),
		RootDisk: filepath.Join(dir, "root-"+suffix),
	}
	for _, p := range []string{img.Kernel, img.Initrd, img.RootDisk} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := json.Marshal(img)
	if err := os.WriteFile(filepath.Join(dir, "current.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func fakeManager(t *testing.T) (*Manager, *fakeSnapshotter, string) {
	t.Helper()
	testenv.RequireRoot(t) // a template boots on a network namespace of its own
	state := t.TempDir()
	writeImage(t, state, "one")
	d := &fakeSnapshotter{}
	m, err := NewManager(Config{StateDir: state, Driver: d, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	return m, d, state
}

func useTemplate(t *testing.T, m *Manager) (vmm.Template, error) {
	t.Helper()
	img, err := m.currentImage()
	if err != nil {
		t.Fatal(err)
	}
	opts, _ := (&Options{}).withDefaults()
	tmpl, release, err := m.template(context.Background(), img, opts)
	if err == nil {
		release()
	}
	return tmpl, err
}

// A template is booted once per image and shape and shared; a new image
// gets a new one and retires the old, which is closed and whose directory
// goes; Shutdown closes the rest.
func TestTemplatesFollowTheImage(t *testing.T) {
	m, d, state := fakeManager(t)
	first, err := useTemplate(t, m)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := useTemplate(t, m); err != nil || again != first {
		t.Fatalf("second use: %v, %v; want the same template", again, err)
	}
	if len(d.saved) != 1 {
		t.Fatalf("%d templates booted for one image and shape, want 1", len(d.saved))
	}
	templateDir := filepath.Dir(first.Config().Dir)
	if _, err := os.Stat(templateDir); err != nil {
		t.Errorf("the template's directory is gone while it serves: %v", err)
	}

	writeImage(t, state, "two")
	second, err := useTemplate(t, m)
	if err != nil {
		t.Fatal(err)
	}
	if second == first || len(d.saved) != 2 || d.images[1] != filepath.Join(state, "images", "kernel-two") {
		t.Fatalf("after the image changed: templates of %v, want a second one of the new image", d.images)
	}
	if d.saved[0].closed != 1 {
		t.Errorf("the old image's template was closed %d times, want once", d.saved[0].closed)
	}
	if _, err := os.Stat(templateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old template's directory outlived it: %v", err)
	}

	// Past its age a template is replaced.
	m.templates.mu.Lock()
	for _, slot := range m.templates.slots {
		slot.builtAt = time.Now().Add(-2 * templateMaxAge)
	}
	m.templates.mu.Unlock()
	if third, err := useTemplate(t, m); err != nil || third == second || d.saved[1].closed != 1 {
		t.Errorf("an old template: got %v (%v), closed %d times; want a new one and the old closed", third, err, d.saved[1].closed)
	}

	if err := m.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if d.saved[2].closed != 1 {
		t.Errorf("Shutdown closed the last template %d times, want once", d.saved[2].closed)
	}
	if entries, _ := os.ReadDir(filepath.Join(state, "sandboxes")); len(entries) > 1 { // .lock
		t.Errorf("left in the sandboxes directory: %v", entries)
	}
}

// After a failed template, Create boots rather than trying again on every
// start; it tries again once templateRetry has passed.
func TestFailedTemplateIsRetriedLater(t *testing.T) {
	m, d, _ := fakeManager(t)
	d.fail = errors.New("no room")
	if _, err := useTemplate(t, m); err == nil {
		t.Fatal("a template despite the failure")
	}
	d.fail = nil
	if _, err := useTemplate(t, m); err == nil || len(d.saved) != 0 {
		t.Fatalf("right after a failure: %v, %d saved; want the failure again without a new boot", err, len(d.saved))
	}
	m.templates.mu.Lock()
	for _, slot := range m.templates.slots {
		slot.builtAt = time.Now().Add(-2 * templateRetry)
	}
	m.templates.mu.Unlock()
	if _, err := useTemplate(t, m); err != nil || len(d.saved) != 1 {
		t.Errorf("after the retry delay: %v, %d saved; want a template", err, len(d.saved))
	}
}

// A template's VMM runs in a cgroup of its own with a sandbox's limits,
// which goes once the template is saved and its VMM with it.
func TestTemplateVMMRunsInItsOwnCgroup(t *testing.T) {
	m, d, _ := fakeManager(t)
	if m.cgroups == nil {
		testenv.Skip(t, "no cgroups for VMMs on this host: %s", m.noCgroups)
	}
	var during []bool
	d.during = func(cfg vmm.Config) {
		for _, dir := range m.cgroups.Dirs(cfg.ID) {
			_, err := os.Stat(dir)
			during = append(during, err == nil)
		}
	}
	if _, err := useTemplate(t, m); err != nil {
		t.Fatal(err)
	}
	cfg := d.saved[0].cfg
	group, ok := cfg.Cgroup.(*cgroup.Group)
	if !ok {
		t.Fatalf("the template was saved with cgroup %#v, want one of its own", cfg.Cgroup)
	}
	opts, _ := (&Options{}).withDefaults()
	want := cgroup.Limits{CPUs: opts.VCPUs, MemoryBytes: int64(opts.MemoryMiB+vmm.DefaultMemoryOverheadMiB) << 20, Tasks: vmmTasks, IOWeight: vmmIOWeight}
	if group.Limits() != want {
		t.Errorf("the template's cgroup limits %+v, want a sandbox's %+v", group.Limits(), want)
	}
	if len(during) == 0 || slices.Contains(during, false) {
		t.Errorf("the template's group directories existed while it was saved: %v, want all", during)
	}
	for _, dir := range m.cgroups.Dirs(cfg.ID) {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the template's group %s outlived its save (%v)", dir, err)
		}
	}
}
