// Package kmod computes, at image build time, which kernel modules the guest
// needs and in what order, and loads that list in the guest at boot.
//
// Debian's kernel package ships no modules.dep (depmod runs in its postinst,
// which the image builder never executes), so dependencies are read from
// each module's own .modinfo ELF section, which is what depmod reads too.
package kmod

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Want names a module the guest needs. Optional modules are skipped when
// the kernel has neither a file nor a built-in for them.
type Want struct {
	Name     string
	Optional bool
}

// GuestModules is what the guest init needs, in the order it matters to a
// reader; Resolve adds dependencies and fixes the real order.
var GuestModules = []Want{
	{Name: "virtio_ring"},
	{Name: "virtio"},
	{Name: "virtio_mmio"},
	{Name: "virtio_pci", Optional: true},
	{Name: "virtio_console"},
	{Name: "virtio_blk"},
	{Name: "virtio_net"},
	// Seeds the kernel's random pool from the host when the VMM attaches
	// a virtio-rng device; without one, the first getrandom call (the
	// scratch directory name) waits about a second for jitter entropy.
	{Name: "virtio_rng", Optional: true},
	{Name: "overlay"},
	{Name: "ext4"},
	{Name: "vsock"},
	{Name: "vmw_vsock_virtio_transport_common"},
	{Name: "vmw_vsock_virtio_transport"},
}

// Module is one loadable module file.
type Module struct {
	Name string
	// Path is relative to the kernel's module directory
	// (lib/modules/<release>), e.g. "kernel/drivers/virtio/virtio.ko".
	Path    string
	Depends []string
}

// Resolve returns the modules to load for want from the module directory
// modDir (lib/modules/<release>), dependencies first. Built-in modules are
// left out.
func Resolve(modDir string, want []Want) ([]Module, error) {
	return resolve(modDir, want, readDepends)
}

func resolve(modDir string, want []Want, depends func(path string) ([]string, error)) ([]Module, error) {
	builtin, err := readBuiltin(filepath.Join(modDir, "modules.builtin"))
	if err != nil {
		return nil, err
	}
	files, err := indexModules(modDir)
	if err != nil {
		return nil, err
	}
	r := resolver{modDir: modDir, builtin: builtin, files: files, depends: depends, state: map[string]int{}}
	for _, w := range want {
		name := canonical(w.Name)
		if builtin[name] {
			continue
		}
		if _, ok := files[name]; !ok {
			if w.Optional {
				continue
			}
			return nil, fmt.Errorf("kmod: module %s: neither built in nor found under %s", w.Name, modDir)
		}
		if err := r.visit(name, nil); err != nil {
			return nil, err
		}
	}
	return r.order, nil
}

// canonical folds the two spellings the kernel accepts for one module name.
func canonical(name string) string {
	return strings.ReplaceAll(name, "-", "_")
}

// Visit states of the depth-first search.
const (
	visiting = 1
	done     = 2
)

type resolver struct {
	modDir  string
	builtin map[string]bool
	files   map[string]string // module name -> relative path
	depends func(path string) ([]string, error)
	state   map[string]int
	order   []Module
}

func (r *resolver) visit(name string, chain []string) error {
	switch r.state[name] {
	case done:
		return nil
	case visiting:
		return fmt.Errorf("kmod: dependency cycle: %s -> %s", strings.Join(chain, " -> "), name)
	}
	if r.builtin[name] {
		r.state[name] = done
		return nil
	}
	rel, ok := r.files[name]
	if !ok {
		return fmt.Errorf("kmod: %s needs module %s, which is neither built in nor present", strings.Join(chain, " -> "), name)
	}
	r.state[name] = visiting
	deps, err := r.depends(filepath.Join(r.modDir, rel))
	if err != nil {
		return err
	}
	for _, d := range deps {
		if err := r.visit(d, append(chain, name)); err != nil {
			return err
		}
	}
	r.state[name] = done
	r.order = append(r.order, Module{Name: name, Path: rel, Depends: deps})
	return nil
}

func readBuiltin(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kmod: read built-in list: %w", err)
	}
	defer f.Close()
	builtin := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			builtin[canonical(strings.TrimSuffix(filepath.Base(line), ".ko"))] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kmod: read built-in list: %w", err)
	}
	return builtin, nil
}

// indexModules maps module names to their paths under modDir. Compressed
// modules are refused: Debian bookworm ships plain .ko files, and reading
// a compressed module's dependencies would need a decompressor for a case
// that does not occur.
func indexModules(modDir string) (map[string]string, error) {
	files := map[string]string{}
	err := filepath.WalkDir(filepath.Join(modDir, "kernel"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		switch {
		case d.IsDir():
			return nil
		case strings.HasSuffix(name, ".ko.xz"), strings.HasSuffix(name, ".ko.zst"), strings.HasSuffix(name, ".ko.gz"):
			return fmt.Errorf("compressed module %s is not supported; decompress the kernel's modules first", path)
		case !strings.HasSuffix(name, ".ko"):
			return nil
		}
		rel, err := filepath.Rel(modDir, path)
		if err != nil {
			return err
		}
		files[canonical(strings.TrimSuffix(name, ".ko"))] = rel
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kmod: index modules: %w", err)
	}
	return files, nil
}

// readDepends returns the "depends=" entry of a module's .modinfo section.
func readDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kmod: open module: %w", err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("kmod: %s: no .modinfo section", path)
	}
	info, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("kmod: %s: read .modinfo: %w", path, err)
	}
	return parseDepends(info), nil
}

// parseDepends extracts the dependency list from .modinfo contents: NUL
// separated key=value strings.
func parseDepends(modinfo []byte) []string {
	var deps []string
	for _, kv := range bytes.Split(modinfo, []byte{0}) {
		v, ok := bytes.CutPrefix(kv, []byte("depends="))
		if !ok {
			continue
		}
		for _, d := range strings.Split(string(v), ",") {
			if d = strings.TrimSpace(d); d != "" {
				deps = append(deps, canonical(d))
			}
		}
	}
	sort.Strings(deps) // stable output for stable image hashes
	return deps
}

// WriteOrder writes the load list the guest reads: one path per line,
// relative to the module directory, dependencies first.
func WriteOrder(w io.Writer, mods []Module) error {
	for _, m := range mods {
		if strings.ContainsAny(m.Path, "\n") {
			return fmt.Errorf("kmod: module path %q contains a newline", m.Path)
		}
		if _, err := fmt.Fprintln(w, m.Path); err != nil {
			return fmt.Errorf("kmod: write order: %w", err)
		}
	}
	return nil
}

// ReadOrder parses what WriteOrder wrote.
func ReadOrder(r io.Reader) ([]string, error) {
	var paths []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if filepath.IsAbs(line) || strings.Contains(line, "..") {
			return nil, fmt.Errorf("kmod: order list: unsafe path %q", line)
		}
		paths = append(paths, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kmod: read order: %w", err)
	}
	if len(paths) == 0 {
		return nil, errors.New("kmod: order list is empty")
	}
	return paths, nil
}

// Where the initramfs keeps modules and their load list; the image builder
// writes them and the guest init reads them.
const (
	// ModuleDir holds the module files, by their path relative to the
	// kernel's lib/modules/<release> (the release is not needed: the
	// initramfs only ever serves one kernel).
	ModuleDir = "/lib/modules"
	// OrderFile lists the modules to load, one path relative to ModuleDir
	// per line, dependencies first.
	OrderFile = "/etc/ephemeral/modules.order"
)
