// Package seal encrypts small secrets at rest (connection headers) with
// AES-256-GCM under one daemon-wide key. The key is configured (64 hex
// digits) or kept in the file secret.key in the state directory, created
// with mode 0600 on first use (and tightened to it, should it be found
// readable by others). Every sealed value
// is bound to a caller-chosen context (for a connection: its organisation
// and name), so a sealed blob copied onto another row does not open.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// KeyFile is the key's file name inside the state directory.
const KeyFile = "secret.key"

const keyBytes = 32

// ErrOpen means a sealed value could not be decrypted: wrong key, wrong
// context or tampered bytes. It never says which.
var ErrOpen = errors.New("seal: cannot open sealed value")

// Key seals and opens values. It is safe for concurrent use.
type Key struct {
	aead cipher.AEAD
}

// LoadKey returns the configured key, hexKey, when it is not empty, else
// the key in stateDir's key file, creating that file when it does not
// exist yet.
func LoadKey(stateDir, hexKey string) (*Key, error) {
	if hexKey != "" {
		raw, err := hex.DecodeString(strings.TrimSpace(hexKey))
		if err != nil || len(raw) != keyBytes {
			return nil, fmt.Errorf("seal: the configured key must be %d hex digits", 2*keyBytes)
		}
		return NewKey(raw)
	}
	return loadKeyFile(filepath.Join(stateDir, KeyFile))
}

// NewKey makes a Key from 32 raw bytes.
func NewKey(raw []byte) (*Key, error) {
	if len(raw) != keyBytes {
		return nil, fmt.Errorf("seal: key must be %d bytes, not %d", keyBytes, len(raw))
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("seal: new cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("seal: new gcm: %w", err)
	}
	return &Key{aead: aead}, nil
}

// loadKeyFile reads path, or creates it with a fresh key. O_EXCL makes two
// processes starting together agree on one key: the loser reads the
// winner's file.
func loadKeyFile(path string) (*Key, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("seal: create key directory: %w", err)
	}
	raw := make([]byte, keyBytes)
	rand.Read(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case err == nil:
		_, werr := f.WriteString(hex.EncodeToString(raw) + "\n")
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("seal: write key file %s: %w", path, err)
		}
		return NewKey(raw)
	case !errors.Is(err, fs.ErrExist):
		return nil, fmt.Errorf("seal: create key file: %w", err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("seal: key file: %w", err)
	}
	// A key file that a copy or an older install left readable by others
	// is made the owner's alone before it is used again.
	if info.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, info.Mode().Perm()&0o700); err != nil {
			return nil, fmt.Errorf("seal: make key file %s private: %w", path, err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seal: read key file: %w", err)
	}
	raw, err = hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != keyBytes {
		// A file being written by another process right now reads short;
		// that is rare enough to report rather than retry.
		return nil, fmt.Errorf("seal: key file %s must hold %d hex digits", path, 2*keyBytes)
	}
	return NewKey(raw)
}

// Seal encrypts plaintext bound to context: nonce || ciphertext+tag.
func (k *Key) Seal(plaintext []byte, context string) []byte {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	rand.Read(nonce)
	return k.aead.Seal(nonce, nonce, plaintext, []byte(context))
}

// Open decrypts what Seal returned for the same context.
func (k *Key) Open(sealed []byte, context string) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(sealed) < n+k.aead.Overhead() {
		return nil, ErrOpen
	}
	out, err := k.aead.Open(nil, sealed[:n], sealed[n:], []byte(context))
	if err != nil {
		return nil, ErrOpen
	}
	return out, nil
}
