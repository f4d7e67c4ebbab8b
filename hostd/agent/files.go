package agent

import (
	"errors"
	"path"
	"strings"
)

// checkScratchPath accepts clean relative paths that stay inside the
// scratch directory.
func checkScratchPath(p string) error {
	switch {
	case p == "" || p == ".":
		return errors.New("empty path")
	case strings.ContainsRune(p, 0):
		return errors.New("path contains a NUL byte")
	case path.IsAbs(p):
		return errors.New("path is absolute")
	case path.Clean(p) != p:
		return errors.New("path is not clean")
	case p == ".." || strings.HasPrefix(p, "../"):
		return errors.New("path leaves the scratch directory")
	}
	return nil
}

// parentDir is the directory part of a relative path, "" for a file
// directly in the scratch directory.
func parentDir(p string) string {
	dir := path.Dir(p)
	if dir == "." {
		return ""
	}
	return dir
}
