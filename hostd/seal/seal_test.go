package seal

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestKeyFileIsCreatedPrivateAndReused(t *testing.T) {
	dir := t.TempDir()
	k1, err := LoadKey(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", info.Mode().Perm())
	}
	sealed := k1.Seal([]byte("Bearer canary"), "org/crm")
	k2, err := LoadKey(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := k2.Open(sealed, "org/crm")
	if err != nil || string(got) != "Bearer canary" {
		t.Fatalf("reopened with the reloaded key: %q, %v", got, err)
	}
	if bytes.Contains(sealed, []byte("canary")) {
		t.Error("sealed bytes contain the plaintext")
	}
}

func TestKeyFileReadableByOthersIsMadePrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	k1, err := LoadKey(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, KeyFile)
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("created under umask 0: %v %v", info.Mode(), err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	k2, err := LoadKey(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("after loading a key file others could read: %v %v", info.Mode(), err)
	}
	if got, err := k2.Open(k1.Seal([]byte("x"), "c"), "c"); err != nil || string(got) != "x" {
		t.Fatalf("the tightened file holds another key: %v", err)
	}
}

func TestConfiguredKey(t *testing.T) {
	raw := bytes.Repeat([]byte{7}, keyBytes)
	dir := t.TempDir()
	k, err := LoadKey(dir, hex.EncodeToString(raw))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, KeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a key file was written although the key was configured: %v", err)
	}
	direct, _ := NewKey(raw)
	if got, err := direct.Open(k.Seal([]byte("x"), "c"), "c"); err != nil || string(got) != "x" {
		t.Errorf("configured key differs from its bytes: %q %v", got, err)
	}
	if _, err := LoadKey(dir, "abcd"); err == nil {
		t.Error("a short configured key was accepted")
	}
}

func TestOpenRefusesWrongContextKeyOrTampering(t *testing.T) {
	k, _ := NewKey(bytes.Repeat([]byte{1}, keyBytes))
	other, _ := NewKey(bytes.Repeat([]byte{2}, keyBytes))
	sealed := k.Seal([]byte("secret"), "acme/crm")
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	for name, open := range map[string]func() ([]byte, error){
		"other context": func() ([]byte, error) { return k.Open(sealed, "evil/crm") },
		"other key":     func() ([]byte, error) { return other.Open(sealed, "acme/crm") },
		"tampered":      func() ([]byte, error) { return k.Open(tampered, "acme/crm") },
		"truncated":     func() ([]byte, error) { return k.Open(sealed[:5], "acme/crm") },
	} {
		if got, err := open(); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: got %q, %v; want ErrOpen", name, got, err)
		}
	}
}
