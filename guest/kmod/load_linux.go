package kmod

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LoadAll loads the modules at paths (relative to modDir) in order with
// finit_module. A module the kernel already has is not an error, so
// LoadAll may run on a kernel that builds some of them in.
func LoadAll(modDir string, paths []string) error {
	for _, rel := range paths {
		if err := load(filepath.Join(modDir, rel)); err != nil {
			return err
		}
	}
	return nil
}

func load(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("kmod: load: %w", err)
	}
	defer f.Close()
	var flags int
	// Kernels built with CONFIG_MODULE_DECOMPRESS unpack compressed
	// modules themselves; the flag tells them to.
	if strings.HasSuffix(path, ".xz") || strings.HasSuffix(path, ".zst") || strings.HasSuffix(path, ".gz") {
		flags |= unix.MODULE_INIT_COMPRESSED_FILE
	}
	if err := unix.FinitModule(int(f.Fd()), "", flags); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("kmod: finit_module %s: %w", filepath.Base(path), err)
	}
	return nil
}
