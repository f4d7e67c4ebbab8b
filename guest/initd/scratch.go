package initd

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
)

// alphanumerics are the characters of a run directory's random suffix.
const alphanumerics = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// randomSuffix returns n characters drawn uniformly from alphanumerics.
func randomSuffix(n int) (string, error) {
	out := make([]byte, 0, n)
	var buf [32]byte
	for len(out) < n {
		if _, err := rand.Read(buf[:]); err != nil {
			return "", fmt.Errorf("initd: random: %w", err)
		}
		for _, b := range buf {
			// 62*4 = 248: rejecting larger bytes keeps every character
			// equally likely.
			if b < 248 && len(out) < n {
				out = append(out, alphanumerics[b%62])
			}
		}
	}
	return string(out), nil
}

// CreateScratch makes <base>/ephemeral-run-<random>/scratch owned by
// uid:gid, with the run directory private to that user, and returns the
// scratch path.
func CreateScratch(base string, uid, gid int) (string, error) {
	suffix, err := randomSuffix(6)
	if err != nil {
		return "", err
	}
	run := filepath.Join(base, "ephemeral-run-"+suffix)
	scratch := filepath.Join(run, "scratch")
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{run, 0o700}, {scratch, 0o755}} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return "", fmt.Errorf("initd: scratch dir: %w", err)
		}
		// Mkdir applies the umask; the mode is part of the contract.
		if err := os.Chmod(d.path, d.mode); err != nil {
			return "", fmt.Errorf("initd: scratch dir: %w", err)
		}
		if err := os.Chown(d.path, uid, gid); err != nil {
			return "", fmt.Errorf("initd: scratch dir: %w", err)
		}
	}
	return scratch, nil
}
