package sandboxid

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestNewIsValidAndFresh(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := New()
		if err := Validate(id); err != nil {
			t.Fatalf("New() = %q, which Validate refuses: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("New() repeated %q", id)
		}
		seen[id] = true
	}
}

func TestValidate(t *testing.T) {
	for _, id := range []string{"0a1b2c3d4e5f", "000000000000", "ffffffffffff"} {
		if err := Validate(id); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{
		"", "0a1b2c3d4e5", "0a1b2c3d4e5f0", "0A1B2C3D4E5F", "0a1b2c3d4e5g",
		"test-0a1b2c3d", "../../etc/x", "0a1b2c/d4e5f", "0a1b2c3d4e5\x00", "0a1b2c3d4eü",
		"run_0123456789abcdef0123456789abcdef", strings.Repeat("a", 1000),
	} {
		if err := Validate(id); err == nil {
			t.Errorf("Validate(%q) = nil, want an error", id)
		}
	}
}

// FuzzValidate checks that an accepted id can only name a plain entry
// directly inside a directory, and is safe inside QEMU's comma-separated
// options.
func FuzzValidate(f *testing.F) {
	for _, seed := range []string{"0a1b2c3d4e5f", "", "../x", "a/b", ".", "..", "eph-x", "\xff", "aaaaaaaaaaa,"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if Validate(id) != nil {
			return
		}
		const dir = "/run/netns"
		name := "eph-" + id
		p := filepath.Join(dir, name)
		if filepath.Dir(p) != dir || filepath.Base(p) != name {
			t.Fatalf("id %q escapes %s: %s", id, dir, p)
		}
		if len(id) != Len || strings.ContainsAny(id, ",= \t\n") {
			t.Fatalf("accepted id %q", id)
		}
	})
}
