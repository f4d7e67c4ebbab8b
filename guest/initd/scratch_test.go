package initd

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCreateScratch(t *testing.T) {
	base := t.TempDir()
	scratch, err := CreateScratch(base, "Ab12Cd", os.Getuid(), os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Dir(scratch)
	if scratch != filepath.Join(base, "ephemeral-run-Ab12Cd", "scratch") {
		t.Fatalf("scratch = %q, want %s/ephemeral-run-Ab12Cd/scratch", scratch, base)
	}
	fi, err := os.Stat(run)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("run dir mode = %v, want 0700", fi.Mode().Perm())
	}
	if _, err := CreateScratch(base, "Ab12Cd", os.Getuid(), os.Getgid()); err == nil {
		t.Error("a second scratch dir of the same name was made")
	}
	if _, err := CreateScratch(base, "../x", os.Getuid(), os.Getgid()); err == nil {
		t.Error("a name with a path separator was accepted")
	}
}
