package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

// exitNoPermission is the exit status of a command refused for want of
// privilege (EX_NOPERM of sysexits.h), so scripts can tell it from a
// failure of the command itself.
const exitNoPermission = 77

// Why each command that boots microVMs or builds the image needs root.
const (
	vmsNeedRoot = "it creates a network namespace, a tap device and nftables rules for each microVM " +
		"and starts QEMU, which then drops to the unprivileged user ephemeral-vmm"
	imageNeedsRoot = "debootstrap builds the guest's root filesystem in a chroot, with device nodes and files owned by other users"
)

// requireRoot refuses, in one sentence, to go on without root, before the
// command meets its first netns, nftables or SQLite permission error.
func requireRoot(c *cli.Context, why string) error {
	if os.Geteuid() == 0 {
		return nil
	}
	return cli.Exit(fmt.Sprintf("ephemeral %s needs root: %s (run it with sudo)", commandPath(c), why), exitNoPermission)
}

// needStateDir refuses, in one sentence, to open the daemon's database in a
// state directory this user cannot use: it is the daemon's alone (mode
// 0700), so an admin command must run as the user serve runs as.
func needStateDir(c *cli.Context, dir string) error {
	// The directory, or where it would be created.
	probe, mode := dir, uint32(unix.R_OK|unix.W_OK|unix.X_OK)
	for {
		_, err := os.Stat(probe)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || filepath.Dir(probe) == probe {
			break
		}
		probe, mode = filepath.Dir(probe), unix.W_OK|unix.X_OK
	}
	if err := unix.Access(probe, mode); errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return cli.Exit(fmt.Sprintf("ephemeral %s needs to read and write the daemon's state directory %s, "+
			"which only its owner may use (run it with sudo, as the user ephemeral serve runs as)", commandPath(c), dir), exitNoPermission)
	}
	return nil
}

// commandPath is the command as typed after the program's name, e.g.
// "sandbox exec".
func commandPath(c *cli.Context) string {
	var names []string
	for _, ctx := range c.Lineage() {
		if ctx.Command != nil && ctx.Command.Name != "" && ctx.Command.Name != c.App.Name {
			names = append([]string{ctx.Command.Name}, names...)
		}
	}
	return strings.Join(names, " ")
}
