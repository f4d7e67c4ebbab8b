package provision

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

func TestRandPoolInfoCreditsEveryByte(t *testing.T) {
	entropy := []byte{1, 2, 3, 4, 5}
	info := randPoolInfo(entropy)
	if bits := binary.NativeEndian.Uint32(info[0:]); bits != 40 {
		t.Errorf("entropy_count = %d bits, want 40", bits)
	}
	if size := binary.NativeEndian.Uint32(info[4:]); size != 5 {
		t.Errorf("buf_size = %d, want 5", size)
	}
	if string(info[8:]) != string(entropy) {
		t.Errorf("buf = %v, want %v", info[8:], entropy)
	}
}

func TestWriteMachineIDReplacesTheImagesID(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, MachineIDPath)
	if err := os.WriteFile(path, []byte("uninitialized\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef"
	if err := WriteMachineID(root, id); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || string(data) != id+"\n" {
		t.Fatalf("machine-id = %q, %v; want %q", data, err, id+"\n")
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("machine-id mode = %v, %v; want 0444", fi.Mode(), err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(root, "etc", ".machine-id-*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}
