package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// provisionEntropy is what the host gives each guest to reseed its
// kernel's CRNG: twice a full seed.
const provisionEntropy = 2 * vsockproto.MinProvisionEntropy

// scratchNameLen and scratchNameChars shape the scratch directory's name,
// /tmp/ephemeral-run-<name>/scratch, as the product page shows it.
const (
	scratchNameLen   = 6
	scratchNameChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
)

// NewProvision draws everything that makes one guest unique, from the
// host's CSPRNG, and stamps the host's time.
func NewProvision() vsockproto.Provision {
	p := vsockproto.Provision{Entropy: make([]byte, provisionEntropy)}
	rand.Read(p.Entropy) // never fails (crypto/rand crashes the program instead)
	var id [16]byte
	rand.Read(id[:])
	// A version 4 UUID, as systemd-machine-id-setup writes it.
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	p.MachineID = hex.EncodeToString(id[:])
	var host [4]byte
	rand.Read(host[:])
	p.Hostname = "ephemeral-" + hex.EncodeToString(host[:])
	p.ScratchName = randomName(scratchNameLen)
	p.Time = time.Now()
	return p
}

// randomName draws n characters uniformly from scratchNameChars.
func randomName(n int) string {
	out := make([]byte, 0, n)
	var buf [32]byte
	for len(out) < n {
		rand.Read(buf[:])
		for _, b := range buf {
			// 62*4 = 248: rejecting larger bytes keeps every character
			// equally likely.
			if b < 248 && len(out) < n {
				out = append(out, scratchNameChars[b%62])
			}
		}
	}
	return string(out)
}
