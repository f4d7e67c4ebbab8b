package auth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

type keyMap map[string]store.APIKey

func (m keyMap) KeyByID(_ context.Context, id string) (store.APIKey, error) {
	k, ok := m[id]
	if !ok {
		return store.APIKey{}, store.ErrNotFound
	}
	return k, nil
}

func (m keyMap) TouchKey(_ context.Context, id string, now time.Time) error {
	k := m[id]
	k.LastUsedAt = &now
	m[id] = k
	return nil
}

func TestAuthenticateRecordsLastUseAtMostOnceAMinute(t *testing.T) {
	k := NewKey()
	recent := time.Now().Add(-10 * time.Second)
	keys := keyMap{k.ID: {ID: k.ID, OrgID: "org_a", Hash: k.Hash}}
	if _, err := Authenticate(context.Background(), keys, "Bearer "+k.Secret); err != nil {
		t.Fatal(err)
	}
	if keys[k.ID].LastUsedAt == nil {
		t.Fatal("first use not recorded")
	}
	keys[k.ID] = store.APIKey{ID: k.ID, OrgID: "org_a", Hash: k.Hash, LastUsedAt: &recent}
	Authenticate(context.Background(), keys, "Bearer "+k.Secret)
	if !keys[k.ID].LastUsedAt.Equal(recent) {
		t.Error("use 10 s after the last one was written again")
	}
	old := time.Now().Add(-2 * time.Minute)
	keys[k.ID] = store.APIKey{ID: k.ID, OrgID: "org_a", Hash: k.Hash, LastUsedAt: &old}
	Authenticate(context.Background(), keys, "Bearer "+k.Secret)
	if keys[k.ID].LastUsedAt.Equal(old) {
		t.Error("use 2 minutes after the last one not recorded")
	}
}

func TestAuthenticate(t *testing.T) {
	good, revoked := NewKey(), NewKey()
	keys := keyMap{
		good.ID:    {ID: good.ID, OrgID: "org_a", Hash: good.Hash},
		revoked.ID: {ID: revoked.ID, OrgID: "org_a", Hash: revoked.Hash, Revoked: true},
	}
	if !strings.HasPrefix(good.Secret, "eph_"+good.ID+"_") || len(good.Secret) < 60 {
		t.Fatalf("key shape %q", good.Secret)
	}
	if p, err := Authenticate(context.Background(), keys, "Bearer "+good.Secret); err != nil || p != (Principal{KeyID: good.ID, OrgID: "org_a"}) {
		t.Fatalf("good key: %+v %v", p, err)
	}
	forged := "eph_" + good.ID + "_" + strings.Repeat("A", 43) // right id, wrong secret
	for _, header := range []string{"", "Bearer", "Bearer ", "bearer " + forged, "Token " + good.Secret,
		"Bearer " + revoked.Secret, "Bearer eph_zz_x", "Bearer " + strings.TrimPrefix(good.Secret, "eph_")} {
		if _, err := Authenticate(context.Background(), keys, header); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%q: %v", header, err)
		}
	}
}

func FuzzParseID(f *testing.F) {
	f.Add(NewKey().Secret)
	f.Add("eph_0123456789abcdef_x")
	f.Add("eph__")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err == nil && (len(id) != 16 || !strings.HasPrefix(s, "eph_"+id+"_")) {
			t.Fatalf("ParseID(%q) = %q", s, id)
		}
	})
}

// A key's last use is recorded when it authenticates, at most once per
// LastUseGranularity; a key that fails to authenticate is not touched.
func TestAuthenticateRecordsLastUse(t *testing.T) {
	good, revoked := NewKey(), NewKey()
	keys := keyMap{
		good.ID:    {ID: good.ID, OrgID: "org_a", Hash: good.Hash},
		revoked.ID: {ID: revoked.ID, OrgID: "org_a", Hash: revoked.Hash, Revoked: true},
	}
	ctx := context.Background()
	before := time.Now()
	if _, err := Authenticate(ctx, keys, "Bearer "+good.Secret); err != nil {
		t.Fatal(err)
	}
	first := keys[good.ID].LastUsedAt
	if first == nil || first.Before(before) {
		t.Fatalf("last use after authenticating: %v", first)
	}
	if _, err := Authenticate(ctx, keys, "Bearer "+good.Secret); err != nil || keys[good.ID].LastUsedAt != first {
		t.Errorf("a second use within %v wrote again: %v (%v)", LastUseGranularity, keys[good.ID].LastUsedAt, err)
	}
	stale := first.Add(-LastUseGranularity)
	keys[good.ID] = store.APIKey{ID: good.ID, OrgID: "org_a", Hash: good.Hash, LastUsedAt: &stale}
	if _, err := Authenticate(ctx, keys, "Bearer "+good.Secret); err != nil || keys[good.ID].LastUsedAt == &stale {
		t.Errorf("a use a minute later was not recorded: %v (%v)", keys[good.ID].LastUsedAt, err)
	}
	keys[good.ID] = store.APIKey{ID: good.ID, OrgID: "org_a", Hash: good.Hash, LastUsedAt: &stale}
	Authenticate(ctx, keys, "Bearer "+revoked.Secret)
	Authenticate(ctx, keys, "Bearer eph_"+good.ID+"_"+strings.Repeat("A", 43)) // right id, wrong secret
	if keys[revoked.ID].LastUsedAt != nil || keys[good.ID].LastUsedAt != &stale {
		t.Errorf("failed authentications touched keys: revoked %v, forged %v", keys[revoked.ID].LastUsedAt, keys[good.ID].LastUsedAt)
	}
}
