package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/config"
)

// --version names the build, the Go release, the VMM the vmm setting picks
// here (or why none is usable) and the guest image, and reports a missing
// part instead of failing on it.
func TestVersionReportsBuildVMMAndImage(t *testing.T) {
	state := t.TempDir()
	var out strings.Builder
	writeVersion(&out, build{version: "v1.2.3", revision: "0123abcd", time: "2026-12-01T03:05:25Z", modified: true},
		config.Config{StateDir: state, VMM: "cloud-hypervisor"}, nil)
	want := regexp.MustCompile(`^ephemeral v1\.2\.3
commit:  0123abcd \(2026-12-01T03:05:25Z, with uncommitted changes\)
go:      ` + regexp.QuoteMeta(runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) + `
vmm:     (cloud-hypervisor \(.*\)|none usable: .*cloud-hypervisor.*)
image:   no image in ` + regexp.QuoteMeta(state) + ` \(make image\)
$`)
	if !want.MatchString(out.String()) {
		t.Errorf("version:\n%s\nwant %s", out.String(), want)
	}

	// A built image is named by its hash.
	dir := filepath.Join(state, "images")
	var parts []string
	for _, name := range []string{"vmlinux", "initrd", "rootfs.ext4"} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, path)
	}
	manifest, _ := json.Marshal(map[string]string{"kernel": parts[0], "initrd": parts[1], "root_disk": parts[2], "hash": "b663853cc1d7a1a981b8"})
	if err := os.WriteFile(filepath.Join(dir, "current.json"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	writeVersion(&out, build{version: "devel"}, config.Config{StateDir: state, VMM: "qemu"}, nil)
	for _, want := range []string{
		"ephemeral devel\n",
		"commit:  unknown (not built from a git checkout)\n",
		"image:   b663853cc1d7a1a981b8 (" + state + ")\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("version lacks %q:\n%s", want, out.String())
		}
	}
	if !regexp.MustCompile(`(?m)^vmm:     (qemu \((kvm|tcg)|none usable: .*qemu)`).MatchString(out.String()) {
		t.Errorf("vmm line:\n%s", out.String())
	}

	// A configuration that does not load leaves the build lines.
	out.Reset()
	writeVersion(&out, build{version: "devel"}, config.Config{}, errors.New(`config: vmm: "bogus": want auto, qemu or cloud-hypervisor`))
	if !strings.HasPrefix(out.String(), "ephemeral devel\ncommit:") || !strings.Contains(out.String(), `vmm:     unknown: config: vmm: "bogus"`) {
		t.Errorf("version with a bad configuration:\n%s", out.String())
	}
}
