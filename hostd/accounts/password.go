package accounts

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
)

// Params are argon2id's cost parameters. They are stored with every hash
// (in the PHC string format), so raising them later leaves old hashes
// verifiable; a hash made with other parameters is replaced at the next
// successful sign-in.
type Params struct {
	Time      uint32 // passes over memory
	MemoryKiB uint32
	Threads   uint8
}

// DefaultParams take about 80 ms on one core of the 2-core development VM
// (measured: t=3, 32 MiB, 1 thread ≈ 80 ms; t=2 ≈ 47 ms), above OWASP's
// minimum for argon2id (19 MiB, t=2, p=1).
var DefaultParams = Params{Time: 3, MemoryKiB: 32 << 10, Threads: 1}

const (
	saltBytes = 16
	keyBytes  = 32
)

var errMalformedHash = errors.New("accounts: malformed password hash")

// hashPassword returns "$argon2id$v=19$m=...,t=...,p=...$<salt>$<key>"
// with a fresh random salt.
func hashPassword(password string, p Params) string {
	salt := make([]byte, saltBytes)
	rand.Read(salt)
	key := argon2.IDKey([]byte(password), salt, p.Time, p.MemoryKiB, p.Threads, keyBytes)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, p.MemoryKiB, p.Time, p.Threads,
		b64.EncodeToString(salt), b64.EncodeToString(key))
}

// checkPassword reports whether password matches encoded, and the
// parameters encoded was made with.
func checkPassword(encoded, password string) (bool, Params, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" {
		return false, Params{}, errMalformedHash
	}
	var version int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return false, Params{}, errMalformedHash
	}
	var p Params
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &p.MemoryKiB, &p.Time, &p.Threads); err != nil ||
		p.Time == 0 || p.Threads == 0 || p.MemoryKiB < 8*uint32(p.Threads) {
		return false, Params{}, errMalformedHash
	}
	b64 := base64.RawStdEncoding
	salt, err := b64.DecodeString(parts[4])
	if err != nil || len(salt) < 8 {
		return false, Params{}, errMalformedHash
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil || len(want) < 16 {
		return false, Params{}, errMalformedHash
	}
	got := argon2.IDKey([]byte(password), salt, p.Time, p.MemoryKiB, p.Threads, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, p, nil
}
