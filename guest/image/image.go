// Package image builds the guest image (kernel, initramfs holding the guest
// init, read-only ext4 root filesystem) from Debian packages, caches the
// parts by content hash under <state-dir>/images, and tells the rest of the
// product where the current image is.
package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrNoImage means no image has been built in the state directory yet.
var ErrNoImage = errors.New("no guest image built; run `ephemeral image build`")

// Image is a bootable guest image. Paths are absolute.
type Image struct {
	Kernel        string `json:"kernel"`
	Initrd        string `json:"initrd"`
	RootDisk      string `json:"root_disk"`
	KernelRelease string `json:"kernel_release"`
	// Hash identifies the combination of the three parts; it changes
	// whenever any input of any part changes.
	Hash string `json:"hash"`
}

// manifestName is the file under images/ that names the current image.
const manifestName = "current.json"

func imagesDir(stateDir string) string {
	return filepath.Join(stateDir, "images")
}

// Load returns the current image of stateDir. It fails with an error
// wrapping ErrNoImage when none has been built or its files are gone.
func Load(stateDir string) (*Image, error) {
	path := filepath.Join(imagesDir(stateDir), manifestName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image: load %s: %w", stateDir, ErrNoImage)
	}
	if err != nil {
		return nil, fmt.Errorf("image: load: %w", err)
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil {
		return nil, fmt.Errorf("image: load %s: %w", path, err)
	}
	for _, p := range []string{img.Kernel, img.Initrd, img.RootDisk} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("image: load %s: path %q is not absolute", path, p)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("image: load: %w (%w)", err, ErrNoImage)
		}
	}
	return &img, nil
}

// writeManifest records img as current, atomically so that a concurrent
// Load sees either the old or the new image.
func writeManifest(stateDir string, img *Image) error {
	data, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return fmt.Errorf("image: write manifest: %w", err)
	}
	dir := imagesDir(stateDir)
	tmp, err := os.CreateTemp(dir, ".manifest-*")
	if err != nil {
		return fmt.Errorf("image: write manifest: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file private; the manifest names no secrets
	// and unprivileged tools read it.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("image: write manifest: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("image: write manifest: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("image: write manifest: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, manifestName)); err != nil {
		return fmt.Errorf("image: write manifest: %w", err)
	}
	return nil
}
