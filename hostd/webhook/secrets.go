package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// SecretPrefix starts every webhook secret, so one is recognisable in a
// configuration.
const SecretPrefix = "whsec_"

// ErrNoSecret means the organisation has no webhook secret yet.
var ErrNoSecret = errors.New("webhook: the organisation has no webhook secret (rotate one)")

// SecretStore keeps sealed secrets (a *store.Store).
type SecretStore interface {
	SetWebhookSecret(ctx context.Context, orgID string, sealed []byte, at time.Time) error
	WebhookSecret(ctx context.Context, orgID string) ([]byte, time.Time, error)
}

// Secrets are the organisations' webhook signing secrets, sealed at rest
// (package seal) and bound to their organisation. A secret is made when
// first asked for with Rotate, shown then and never again; rotating
// replaces it at once, for every attempt after.
type Secrets struct {
	store SecretStore
	key   *seal.Key
}

// NewSecrets returns the secrets kept in st, sealed with key.
func NewSecrets(st SecretStore, key *seal.Key) *Secrets { return &Secrets{store: st, key: key} }

func sealContext(orgID string) string { return "webhook-secret/" + orgID }

// Rotate makes a new secret for the organisation, replacing any old one,
// and returns it: the only time it is shown.
func (s *Secrets) Rotate(ctx context.Context, orgID string) (string, time.Time, error) {
	raw := make([]byte, 32)
	rand.Read(raw)
	secret := SecretPrefix + hex.EncodeToString(raw)
	now := time.Now().UTC().Truncate(time.Millisecond)
	if err := s.store.SetWebhookSecret(ctx, orgID, s.key.Seal([]byte(secret), sealContext(orgID)), now); err != nil {
		return "", time.Time{}, fmt.Errorf("webhook: rotate secret: %w", err)
	}
	return secret, now, nil
}

// Secret opens the organisation's secret; ErrNoSecret when it has none.
func (s *Secrets) Secret(ctx context.Context, orgID string) (string, error) {
	sealed, _, err := s.store.WebhookSecret(ctx, orgID)
	if errors.Is(err, store.ErrNotFound) {
		return "", ErrNoSecret
	}
	if err != nil {
		return "", fmt.Errorf("webhook: secret: %w", err)
	}
	plain, err := s.key.Open(sealed, sealContext(orgID))
	if err != nil || !strings.HasPrefix(string(plain), SecretPrefix) {
		return "", fmt.Errorf("webhook: open the secret of %s: %w", orgID, seal.ErrOpen)
	}
	return string(plain), nil
}

// Exists reports whether the organisation has a secret, without opening it.
func (s *Secrets) Exists(ctx context.Context, orgID string) (bool, error) {
	_, _, err := s.store.WebhookSecret(ctx, orgID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}
