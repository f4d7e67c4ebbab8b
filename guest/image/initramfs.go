package image

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/ephemeralhq/ephemeral/guest/cpio"
	"github.com/ephemeralhq/ephemeral/guest/kmod"
)

// writeInitramfs writes an uncompressed newc archive (the fastest to unpack
// under TCG) holding the init, the modules it loads and their load order.
func writeInitramfs(dst, initBinary, modDir string) error {
	mods, err := kmod.Resolve(modDir, kmod.GuestModules)
	if err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	var order bytes.Buffer
	if err := kmod.WriteOrder(&order, mods); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}

	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	defer f.Close()
	buf := bufio.NewWriterSize(f, 1<<20)
	w := cpio.NewWriter(buf)
	dirs := newDirSet(w)

	// The kernel opens /dev/console for init's stdio before init runs;
	// without the node, init starts with no stdout at all.
	if err := dirs.ensure("dev"); err != nil {
		return err
	}
	if err := w.CharDevice(cpio.Entry{Name: "dev/console", Perm: 0o600}, 5, 1); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	for _, d := range []string{"proc", "sys", "newroot", "overlay"} {
		if err := dirs.ensure(d); err != nil {
			return err
		}
	}
	if err := addFile(w, dirs, "init", 0o755, initBinary); err != nil {
		return err
	}
	modRoot := strings.TrimPrefix(kmod.ModuleDir, "/")
	for _, m := range mods {
		if err := addFile(w, dirs, path.Join(modRoot, m.Path), 0o644, path.Join(modDir, m.Path)); err != nil {
			return err
		}
	}
	if err := dirs.ensure(path.Dir(strings.TrimPrefix(kmod.OrderFile, "/"))); err != nil {
		return err
	}
	if err := w.File(cpio.Entry{Name: kmod.OrderFile, Perm: 0o644}, int64(order.Len()), &order); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	if err := buf.Flush(); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	return nil
}

func addFile(w *cpio.Writer, dirs dirSet, name string, perm os.FileMode, src string) error {
	if err := dirs.ensure(path.Dir(name)); err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	if err := w.File(cpio.Entry{Name: name, Perm: perm}, fi.Size(), f); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	return nil
}

// dirSet writes each parent directory once, before its first child.
type dirSet struct {
	w    *cpio.Writer
	seen map[string]bool
}

func newDirSet(w *cpio.Writer) dirSet {
	return dirSet{w: w, seen: map[string]bool{".": true, "": true}}
}

func (d dirSet) ensure(dir string) error {
	if d.seen[dir] {
		return nil
	}
	if err := d.ensure(path.Dir(dir)); err != nil {
		return err
	}
	d.seen[dir] = true
	if err := d.w.Dir(cpio.Entry{Name: dir, Perm: 0o755}); err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	return nil
}
