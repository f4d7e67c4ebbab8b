package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/guest/image"
)

// initBinaryName is the guest init that `make build` puts next to this
// executable.
const initBinaryName = "ephemeral-init"

var imageCommand = &cli.Command{
	Name:  "image",
	Usage: "build and inspect the guest image",
	Subcommands: []*cli.Command{{
		Name:  "build",
		Usage: "build the kernel, initramfs and root filesystem (cached by content hash)",
		Flags: append(settingFlags("debian-mirror"),
			&cli.BoolFlag{Name: "force", Usage: "rebuild every part even if cached"},
			&cli.StringFlag{Name: "init", Usage: "static guest init binary (default: " + initBinaryName + " next to this executable)"},
		),
		Action: buildImage,
	}, {
		Name:  "show",
		Usage: "print the current image's files",
		Action: func(c *cli.Context) error {
			loaded, err := loadConfig(c)
			if err != nil {
				return err
			}
			img, err := image.Load(loaded.Config.StateDir)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "hash:     %s\nkernel:   %s (%s)\ninitrd:   %s\nrootdisk: %s\n",
				img.Hash, img.Kernel, img.KernelRelease, img.Initrd, img.RootDisk)
			return nil
		},
	}},
}

func buildImage(c *cli.Context) error {
	if err := requireRoot(c, imageNeedsRoot); err != nil {
		return err
	}
	initPath := c.String("init")
	if initPath == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("image build: locate %s: %w; pass --init", initBinaryName, err)
		}
		initPath = filepath.Join(filepath.Dir(self), initBinaryName)
	}
	loaded, err := loadConfig(c)
	if err != nil {
		return err
	}
	img, err := image.Build(c.Context, image.Options{
		StateDir:   loaded.Config.StateDir,
		InitBinary: initPath,
		Mirror:     loaded.Config.DebianMirror,
		Force:      c.Bool("force"),
		Progress:   c.App.ErrWriter,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "image %s\nkernel:   %s (%s)\ninitrd:   %s\nrootdisk: %s\n",
		img.Hash, img.Kernel, img.KernelRelease, img.Initrd, img.RootDisk)
	return nil
}
