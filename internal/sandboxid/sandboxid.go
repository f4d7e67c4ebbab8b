// Package sandboxid is the one rule for sandbox ids. An id names a
// sandbox's state directory, its network namespace (eph-<id>), its VMM
// process and everything reconciliation may sweep after a crash, so every
// layer accepts exactly the ids New makes and treats anything else as not
// its own.
package sandboxid

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// randomBytes is the entropy of an id: 48 bits make a collision among the
// sandboxes of one host negligible while keeping names short in listings.
const randomBytes = 6

// Len is the length of an id: randomBytes as lowercase hex.
const Len = 2 * randomBytes

// New returns a fresh random id.
func New() string {
	var b [randomBytes]byte
	rand.Read(b[:]) // never fails (crypto/rand crashes the program instead)
	return hex.EncodeToString(b[:])
}

// Validate reports whether id has the shape New gives: Len lowercase hex
// digits. Such an id is safe as a file name and inside VMM options.
func Validate(id string) error {
	if len(id) != Len {
		return fmt.Errorf("sandbox id %.80q: want %d lowercase hex digits", id, Len)
	}
	for _, r := range id {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return fmt.Errorf("sandbox id %q: want %d lowercase hex digits", id, Len)
		}
	}
	return nil
}
