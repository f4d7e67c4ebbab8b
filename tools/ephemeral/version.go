package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/guest/image"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
)

// build is what the Go toolchain stamped into this binary.
type build struct {
	version  string // the module version, "devel" for a build from a checkout
	revision string // the VCS commit, empty when unknown
	time     string // the commit's time
	modified bool   // built from a tree with uncommitted changes
}

func readBuild() build {
	b := build{version: "devel"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		b.version = v
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.time":
			b.time = s.Value
		case "vcs.modified":
			b.modified = s.Value == "true"
		}
	}
	return b
}

// printVersion is `ephemeral --version`: the build, and what this host
// would run microVMs with. It needs no root and reports a missing part
// instead of failing on it.
func printVersion(c *cli.Context) {
	loaded, err := loadConfig(c)
	writeVersion(c.App.Writer, readBuild(), loaded.Config, err)
}

func writeVersion(w io.Writer, b build, cfg config.Config, cfgErr error) {
	fmt.Fprintf(w, "ephemeral %s\n", b.version)
	commit := "unknown (not built from a git checkout)"
	if b.revision != "" {
		var notes []string
		if b.time != "" {
			notes = append(notes, b.time)
		}
		if b.modified {
			notes = append(notes, "with uncommitted changes")
		}
		commit = b.revision
		if len(notes) > 0 {
			commit += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	fmt.Fprintf(w, "commit:  %s\n", commit)
	fmt.Fprintf(w, "go:      %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if cfgErr != nil {
		fmt.Fprintf(w, "vmm:     unknown: %v\nimage:   unknown: %v\n", cfgErr, cfgErr)
		return
	}
	fmt.Fprintf(w, "vmm:     %s\n", describeVMM(cfg.VMM))
	fmt.Fprintf(w, "image:   %s\n", describeImage(cfg.StateDir))
}

// describeVMM names the VMM the vmm setting picks here and how it would run
// guests, or why none can.
func describeVMM(choice string) string {
	driver, err := sandbox.Detect(choice)
	if err != nil {
		return "none usable: " + err.Error()
	}
	desc := sandbox.DescribeDriver(driver)
	if os.Geteuid() != 0 {
		// Hardware KVM is probed by opening /dev/kvm, which root (the
		// daemon) may be able to do where this user cannot.
		desc += fmt.Sprintf(", as probed by uid %d rather than root", os.Geteuid())
	}
	return desc
}

// describeImage is the current guest image's id, or why there is none.
func describeImage(stateDir string) string {
	img, err := image.Load(stateDir)
	switch {
	case errors.Is(err, image.ErrNoImage):
		return "no image in " + stateDir + " (make image)"
	case err != nil:
		return "unreadable: " + err.Error()
	}
	return img.Hash + " (" + stateDir + ")"
}
