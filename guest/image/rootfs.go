package image

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Worker account of the guest; the guest init runs commands as this user.
const (
	workerName = "worker"
	workerID   = 1000
	workerHome = "/home/worker"
)

// buildRootfs runs debootstrap into a scratch directory, trims and
// configures the tree, and packs it into dir/rootfs.ext4 without mounting.
func (b builder) buildRootfs(ctx context.Context, dir string) error {
	tree := filepath.Join(dir, "tree")
	args := []string{"--variant=minbase", "--include=" + strings.Join(Packages, ","), Suite, tree, b.opts.Mirror}
	b.progress("rootfs: debootstrap %s (takes a minute or more)", strings.Join(args, " "))
	if err := b.run(ctx, "debootstrap", "debootstrap", args...); err != nil {
		return err
	}
	if err := configureTree(tree); err != nil {
		return err
	}
	if err := trimTree(tree); err != nil {
		return err
	}
	usage, err := measureTree(tree)
	if err != nil {
		return err
	}
	size, inodes := usage.ext4Size()
	disk := filepath.Join(dir, rootfsFile)
	b.progress("rootfs: mkfs.ext4 %d MiB, %d inodes for %d MiB of files", size>>20, inodes, usage.bytes>>20)
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	if err := os.Truncate(disk, size); err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	// No journal: the disk is attached read-only, and a journal only
	// costs space and replay checks at mount.
	if err := b.run(ctx, "", "mkfs.ext4", "-q", "-F", "-L", "ephemeral-root",
		"-O", "^has_journal", "-m", "0", "-b", "4096", "-N", strconv.FormatInt(inodes, 10),
		"-E", "root_owner=0:0", "-d", tree, disk); err != nil {
		return err
	}
	if err := os.RemoveAll(tree); err != nil {
		return fmt.Errorf("image: rootfs: remove build tree: %w", err)
	}
	return nil
}

// configureTree adds the worker account and the files that make the guest
// a sandbox: no resolver, a fixed hostname.
func configureTree(tree string) error {
	appends := []struct {
		file, line string
	}{
		{"etc/passwd", fmt.Sprintf("%s:x:%d:%d:Ephemeral worker:%s:/bin/bash", workerName, workerID, workerID, workerHome)},
		{"etc/group", fmt.Sprintf("%s:x:%d:", workerName, workerID)},
		{"etc/shadow", workerName + ":!:19000:0:99999:7:::"},
	}
	for _, a := range appends {
		if err := appendLine(filepath.Join(tree, a.file), a.line); err != nil {
			return err
		}
	}
	home := filepath.Join(tree, workerHome)
	if err := os.MkdirAll(home, 0o750); err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	if err := os.Chown(home, workerID, workerID); err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	files := map[string]string{
		// The guest never gets a resolver: name lookups must fail.
		"etc/resolv.conf": "",
		"etc/hostname":    "ephemeral\n",
		"etc/hosts":       "127.0.0.1\tlocalhost ephemeral\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	}
	for name, content := range files {
		p := filepath.Join(tree, name)
		// resolv.conf may be a symlink left by the host's debootstrap.
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("image: rootfs: %w", err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("image: rootfs: %w", err)
		}
	}
	return nil
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	if _, err := fmt.Fprintln(f, line); err != nil {
		f.Close()
		return fmt.Errorf("image: rootfs: append to %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	return nil
}

// trimmed are emptied: package caches, indexes and documentation nobody
// reads inside a sandbox.
var trimmed = []string{
	"var/cache/apt", "var/lib/apt/lists", "var/cache/debconf", "var/log",
	"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
	"usr/share/lintian", "usr/share/linda",
}

func trimTree(tree string) error {
	for _, rel := range trimmed {
		dir := filepath.Join(tree, rel)
		entries, err := os.ReadDir(dir)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("image: rootfs: trim: %w", err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("image: rootfs: trim: %w", err)
			}
		}
	}
	return nil
}

// treeUsage is what the files of a tree need on ext4.
type treeUsage struct {
	bytes  int64 // data rounded up to whole 4 KiB blocks
	inodes int64
}

func measureTree(tree string) (treeUsage, error) {
	var u treeUsage
	err := filepath.WalkDir(tree, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		u.inodes++
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() || fi.IsDir() {
			u.bytes += (fi.Size() + 4095) &^ 4095
		}
		return nil
	})
	if err != nil {
		return u, fmt.Errorf("image: rootfs: measure: %w", err)
	}
	return u, nil
}

// ext4Size returns a disk size and inode count with room for metadata
// (inode tables, bitmaps, directories) on top of the data.
func (u treeUsage) ext4Size() (size, inodes int64) {
	inodes = u.inodes + u.inodes/4 + 1024
	size = u.bytes + u.bytes/10 + inodes*256 + 32<<20
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	return size, inodes
}
