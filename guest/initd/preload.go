package initd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Preloaded are the files every user command needs, whatever it runs: the
// dynamic loader and libc of every program, and bash with its terminal
// library, which runs every agent command. PreloadFiles reads them into
// the page cache before the init waits for its host. A guest restored
// from a snapshot then finds them in memory it shares with every other
// clone, instead of reading them through its block device on its first
// command with nothing of that path translated yet (under TCG about 50 ms
// of a clone's first command). A booted guest reads them at boot instead
// of at its first command.
var Preloaded = []string{
	"/usr/lib64/ld-linux-x86-64.so.2",
	"/usr/lib/x86_64-linux-gnu/libc.so.6",
	"/usr/bin/bash",
	"/usr/lib/x86_64-linux-gnu/libtinfo.so.6",
}

// PreloadFiles reads each of paths under root once, into the page cache.
// A file the image lacks is skipped: it is only not preloaded.
func PreloadFiles(root string, paths []string) error {
	buf := make([]byte, 64<<10)
	for _, p := range paths {
		f, err := os.Open(filepath.Join(root, p))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("initd: preload: %w", err)
		}
		_, err = io.CopyBuffer(io.Discard, onlyReader{f}, buf)
		f.Close()
		if err != nil {
			return fmt.Errorf("initd: preload %s: %w", p, err)
		}
	}
	return nil
}

// onlyReader hides a file's WriterTo, so that io.CopyBuffer reads it with
// the caller's buffer rather than allocating its own.
type onlyReader struct{ io.Reader }
