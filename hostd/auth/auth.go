// Package auth issues and checks API keys. A key is shown once when it is
// created; the daemon stores only its SHA-256 hash and compares hashes in
// constant time, so neither a database leak nor response timing reveals a
// usable key.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// Prefix starts every key, so leaked keys are easy to recognise and scan for.
const Prefix = "eph_"

// ErrUnauthenticated covers every way a presented key can be wrong; callers
// must not tell the client which one it was.
var ErrUnauthenticated = errors.New("auth: invalid API key")

// Key is a freshly issued key.
type Key struct {
	ID     string // public part, safe to log and to name in `key revoke`
	Secret string // the whole key, shown to the user once
	Hash   []byte // what is stored
}

// NewKey issues a key "eph_<id>_<secret>".
func NewKey() Key {
	id := make([]byte, 8)
	secret := make([]byte, 32)
	rand.Read(id)
	rand.Read(secret)
	k := Key{ID: hex.EncodeToString(id)}
	k.Secret = Prefix + k.ID + "_" + base64.RawURLEncoding.EncodeToString(secret)
	k.Hash = Hash(k.Secret)
	return k
}

// Hash is the stored form of a key.
func Hash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// ParseID extracts the key id from a presented key without trusting it.
func ParseID(secret string) (string, error) {
	rest, ok := strings.CutPrefix(secret, Prefix)
	if !ok {
		return "", ErrUnauthenticated
	}
	id, _, ok := strings.Cut(rest, "_")
	if !ok || len(id) != 16 {
		return "", ErrUnauthenticated
	}
	if _, err := hex.DecodeString(id); err != nil {
		return "", ErrUnauthenticated
	}
	return id, nil
}

// keyStore finds stored keys by id and records their use.
type keyStore interface {
	KeyByID(ctx context.Context, id string) (store.APIKey, error)
	TouchKey(ctx context.Context, id string, now time.Time) error
}

// LastUseGranularity is how stale a key's recorded last use may get: a key
// used constantly costs one write per this interval, not one per request.
const LastUseGranularity = time.Minute

// Principal is who a valid key speaks for.
type Principal struct {
	KeyID string
	OrgID string
}

// Authenticate checks an Authorization header value ("Bearer eph_...") and
// returns the key's id and organisation, recording that the key was used.
func Authenticate(ctx context.Context, keys keyStore, header string) (Principal, error) {
	scheme, secret, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Principal{}, ErrUnauthenticated
	}
	id, err := ParseID(strings.TrimSpace(secret))
	if err != nil {
		return Principal{}, err
	}
	k, err := keys.KeyByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, ErrUnauthenticated
	}
	if err != nil {
		return Principal{}, fmt.Errorf("auth: look up key: %w", err)
	}
	if subtle.ConstantTimeCompare(k.Hash, Hash(strings.TrimSpace(secret))) != 1 || k.Revoked {
		return Principal{}, ErrUnauthenticated
	}
	if now := time.Now(); k.LastUsedAt == nil || now.Sub(*k.LastUsedAt) >= LastUseGranularity {
		// A failed write costs the key's last-use time, not the request.
		_ = keys.TouchKey(ctx, id, now)
	}
	return Principal{KeyID: k.ID, OrgID: k.OrgID}, nil
}
