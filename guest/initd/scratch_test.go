package initd

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestRandomSuffixUsesOnlyAlphanumerics(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		s, err := randomSuffix(6)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^[A-Za-z0-9]{6}$`).MatchString(s) {
			t.Fatalf("suffix %q is not 6 alphanumerics", s)
		}
		seen[s] = true
	}
	// 62^6 values: 200 draws colliding means the source is not random.
	if len(seen) < 199 {
		t.Errorf("only %d distinct suffixes in 200 draws", len(seen))
	}
}

func TestCreateScratch(t *testing.T) {
	base := t.TempDir()
	scratch, err := CreateScratch(base, os.Getuid(), os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Dir(scratch)
	if filepath.Base(scratch) != "scratch" || filepath.Dir(run) != base || !strings.HasPrefix(filepath.Base(run), "ephemeral-run-") {
		t.Fatalf("scratch = %q, want %s/ephemeral-run-XXXXXX/scratch", scratch, base)
	}
	fi, err := os.Stat(run)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("run dir mode = %v, want 0700", fi.Mode().Perm())
	}
}
