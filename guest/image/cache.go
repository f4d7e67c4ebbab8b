package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// builderVersion changes whenever the builder would produce different
// output from the same inputs, invalidating every cached part.
const builderVersion = "1"

// partKey hashes the inputs of one image part. Each input is length-prefixed
// so that no two different input lists hash alike.
func partKey(kind string, inputs ...string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", kind, builderVersion)
	for _, in := range inputs {
		fmt.Fprintf(h, "%d:%s\x00", len(in), in)
	}
	return hex.EncodeToString(h.Sum(nil))[:20]
}

// rootfsKey covers what debootstrap is asked for.
func rootfsKey(suite, mirror string, packages []string) string {
	return partKey("rootfs", suite, mirror, strings.Join(packages, ","))
}

// kernelKey covers the exact kernel package version.
func kernelKey(pkg, version string) string {
	// "pvh" since kernel parts also hold the decompressed PVH kernel.
	return partKey("kernel", pkg, version, "pvh")
}

// initrdKey covers the init binary, the kernel whose modules it carries and
// the wanted module list.
func initrdKey(initSHA256, kernelKey string, modules []string) string {
	return partKey("initrd", initSHA256, kernelKey, strings.Join(modules, ","))
}

// imageHash names the combination of parts.
func imageHash(rootfs, kernel, initrd string) string {
	return partKey("image", rootfs, kernel, initrd)
}

// cachedPart is a directory images/<kind>-<key> that exists only when
// complete: parts are built in a temporary directory and renamed into place.
type cachedPart struct {
	dir string
}

func newCachedPart(stateDir, kind, key string) cachedPart {
	return cachedPart{dir: filepath.Join(imagesDir(stateDir), kind+"-"+key)}
}

func (p cachedPart) exists() bool {
	fi, err := os.Stat(p.dir)
	return err == nil && fi.IsDir()
}

func (p cachedPart) path(name string) string {
	return filepath.Join(p.dir, name)
}

// build runs fill on a fresh temporary directory and moves the result into
// place, replacing an older build of the same key (--force). A VM that has
// the old files open keeps reading them.
func (p cachedPart) build(fill func(tmp string) error) error {
	parent := filepath.Dir(p.dir)
	tmp, err := os.MkdirTemp(parent, ".build-"+filepath.Base(p.dir)+"-")
	if err != nil {
		return fmt.Errorf("image: create build dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("image: create build dir: %w", err)
	}
	if err := fill(tmp); err != nil {
		return err
	}
	if p.exists() {
		old := tmp + ".old"
		if err := os.Rename(p.dir, old); err != nil {
			return fmt.Errorf("image: replace %s: %w", p.dir, err)
		}
		defer os.RemoveAll(old)
	}
	if err := os.Rename(tmp, p.dir); err != nil {
		return fmt.Errorf("image: install %s: %w", p.dir, err)
	}
	return nil
}
