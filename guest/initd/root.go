package initd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/guest/kmod"
)

// LoadModules loads the modules the image builder listed, in its order.
func LoadModules() error {
	f, err := os.Open(kmod.OrderFile)
	if err != nil {
		return fmt.Errorf("initd: load modules: %w", err)
	}
	defer f.Close()
	paths, err := kmod.ReadOrder(f)
	if err != nil {
		return fmt.Errorf("initd: load modules: %w", err)
	}
	if err := kmod.LoadAll(kmod.ModuleDir, paths); err != nil {
		return fmt.Errorf("initd: load modules: %w", err)
	}
	return nil
}

// WaitForDevice waits until devtmpfs shows path: virtio devices probe as
// their driver loads, but the block device node can appear a moment later.
func WaitForDevice(ctx context.Context, path string) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("initd: wait for %s: %w", path, ctx.Err())
		case <-tick.C:
		}
	}
}

// Overlay root layout inside the initramfs.
const (
	overlayBase = "/overlay" // tmpfs holding the lower mount point, upper and work dirs
	newRoot     = "/newroot"
)

// SwitchToOverlayRoot mounts disk (ext4) read-only, puts an overlay on top
// whose writable layer is a tmpfs of upperMiB, moves the kernel
// filesystems into it and makes it the root. Everything written afterwards
// lives in RAM and dies with the VM.
func SwitchToOverlayRoot(disk string, upperMiB int) error {
	upperFS := Mount{Source: "overlay-rw", Target: overlayBase, FSType: "tmpfs", Data: fmt.Sprintf("mode=0755,size=%dm", upperMiB)}
	if err := MountAll([]Mount{upperFS}); err != nil {
		return err
	}
	lower := filepath.Join(overlayBase, "lower")
	upper := filepath.Join(overlayBase, "upper")
	work := filepath.Join(overlayBase, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("initd: overlay: %w", err)
		}
	}
	steps := []Mount{
		{Source: disk, Target: lower, FSType: "ext4", Flags: unix.MS_RDONLY},
		{Source: "overlay", Target: newRoot, FSType: "overlay",
			Data: fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)},
	}
	if err := MountAll(steps); err != nil {
		return err
	}
	for _, m := range movedMounts {
		target := filepath.Join(newRoot, m)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("initd: move %s: %w", m, err)
		}
		if err := unix.Mount(m, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("initd: move %s: %w", m, os.NewSyscallError("mount", err))
		}
	}
	// The switch_root dance: the initramfs cannot be unmounted, so the new
	// root is moved over "/" and chroot makes it the process's root.
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("initd: switch root: %w", os.NewSyscallError("chdir", err))
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("initd: switch root: %w", os.NewSyscallError("mount", err))
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("initd: switch root: %w", os.NewSyscallError("chroot", err))
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("initd: switch root: %w", os.NewSyscallError("chdir", err))
	}
	return nil
}

// PowerOff flushes filesystems and ends the VM. The QEMU driver runs with
// -no-reboot, so the restart fallback ends it too.
func PowerOff() error {
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	if rerr := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); rerr != nil {
		return fmt.Errorf("initd: power off: %w; restart: %w", os.NewSyscallError("reboot", err), os.NewSyscallError("reboot", rerr))
	}
	return nil
}
