package initd

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPreloadFilesReadsWhatExistsAndSkipsTheRest(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr", "bin", "bash"), make([]byte, 200<<10), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := PreloadFiles(root, []string{"/usr/bin/bash", "/usr/bin/missing"}); err != nil {
		t.Errorf("PreloadFiles = %v, want the missing file skipped", err)
	}
	if err := os.Mkdir(filepath.Join(root, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := PreloadFiles(root, []string{"/dir"}); err == nil {
		t.Error("PreloadFiles of a directory succeeded")
	}
}
