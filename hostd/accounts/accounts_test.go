package accounts

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// testParams keep the tests fast; the real parameters are measured in
// BenchmarkHashPassword.
var testParams = Params{Time: 1, MemoryKiB: 64, Threads: 1}

func newService(t *testing.T, cfg Config) (*Service, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if cfg.KDF == (Params{}) {
		cfg.KDF = testParams
	}
	return New(st, cfg), st
}

func TestPasswordHashes(t *testing.T) {
	h := hashPassword("correct horse", DefaultParams)
	if !strings.HasPrefix(h, "$argon2id$v=19$m=32768,t=3,p=1$") {
		t.Fatalf("hash %q does not state its parameters", h)
	}
	if h == hashPassword("correct horse", DefaultParams) {
		t.Error("two hashes of one password are equal: no salt")
	}
	ok, p, err := checkPassword(h, "correct horse")
	if err != nil || !ok || p != DefaultParams {
		t.Fatalf("right password: %v %+v %v", ok, p, err)
	}
	if ok, _, _ := checkPassword(h, "correct horsf"); ok {
		t.Error("wrong password accepted")
	}
	for _, bad := range []string{"", "$argon2i$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$a2V5a2V5a2V5a2V5a2V5", h[:len(h)-10] + "$", "plain"} {
		if _, _, err := checkPassword(bad, "x"); err == nil {
			t.Errorf("malformed hash %q accepted", bad)
		}
	}
}

func BenchmarkHashPassword(b *testing.B) {
	for b.Loop() {
		hashPassword("correct horse battery", DefaultParams)
	}
}

func TestRegisterCreatesAFundedOrganisationAndSignsIn(t *testing.T) {
	ctx := context.Background()
	var provisioned string
	svc, st := newService(t, Config{StarterCreditMicros: 1_000_000,
		Provision: func(_ context.Context, orgID string) error { provisioned = orgID; return nil }})
	token, u, err := svc.Register(ctx, "  Ada@Example.org ", "correct horse", "192.0.2.1", "")
	if err != nil {
		t.Fatal(err)
	}
	if u.Email != "ada@example.org" || provisioned != u.OrgID {
		t.Errorf("user %+v, provisioned %q", u, provisioned)
	}
	if bal, _ := st.Balance(ctx, u.OrgID); bal.Available != 1_000_000 {
		t.Errorf("starter balance %+v", bal)
	}
	sess, err := svc.Session(ctx, token)
	if err != nil || sess.User.ID != u.ID {
		t.Fatalf("session of the new account: %+v %v", sess, err)
	}
	for _, tc := range []struct {
		email, password string
		want            error
	}{
		{"ada@example.org", "another password", ErrEmailTaken},
		{"not-an-email", "correct horse", ErrInvalidEmail},
		{"Ada <ada2@example.org>", "correct horse", ErrInvalidEmail},
		{"ada2@localhost", "correct horse", ErrInvalidEmail},
		{"ada2@example.org", "short", ErrWeakPassword},
		{"ada2@example.org", strings.Repeat("x", MaxPasswordBytes+1), ErrWeakPassword},
	} {
		if _, _, err := svc.Register(ctx, tc.email, tc.password, "192.0.2.1", ""); !errors.Is(err, tc.want) {
			t.Errorf("register %q/%d bytes: %v, want %v", tc.email, len(tc.password), err, tc.want)
		}
	}
}

func TestSignInRotatesTheSessionAndSignOutEndsIt(t *testing.T) {
	ctx := context.Background()
	svc, _ := newService(t, Config{})
	first, _, err := svc.Register(ctx, "ada@example.org", "correct horse", "192.0.2.1", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.SignIn(ctx, "ada@example.org", "wrong horse", "192.0.2.1", first); !errors.Is(err, ErrBadCredentials) {
		t.Fatalf("wrong password: %v", err)
	}
	if _, _, err := svc.SignIn(ctx, "nobody@example.org", "correct horse", "192.0.2.1", ""); !errors.Is(err, ErrBadCredentials) {
		t.Fatalf("unknown email: %v", err)
	}
	second, _, err := svc.SignIn(ctx, "ADA@example.org", "correct horse", "192.0.2.1", first)
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatal("signing in kept the token")
	}
	if _, err := svc.Session(ctx, first); !errors.Is(err, ErrNoSession) {
		t.Errorf("the token from before signing in still works: %v", err)
	}
	if err := svc.SignOut(ctx, second); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Session(ctx, second); !errors.Is(err, ErrNoSession) {
		t.Errorf("signed-out token still works: %v", err)
	}
}

func TestChangePasswordEndsOtherSessions(t *testing.T) {
	ctx := context.Background()
	svc, _ := newService(t, Config{})
	here, u, _ := svc.Register(ctx, "ada@example.org", "correct horse", "192.0.2.1", "")
	elsewhere, _, _ := svc.SignIn(ctx, "ada@example.org", "correct horse", "198.51.100.7", "")
	if _, err := svc.ChangePassword(ctx, u, here, "wrong horse", "battery staple"); !errors.Is(err, ErrBadCredentials) {
		t.Fatalf("change with the wrong current password: %v", err)
	}
	next, err := svc.ChangePassword(ctx, u, here, "correct horse", "battery staple")
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"old token here": here, "other browser": elsewhere} {
		if _, err := svc.Session(ctx, tok); !errors.Is(err, ErrNoSession) {
			t.Errorf("%s survived the password change: %v", name, err)
		}
	}
	if _, err := svc.Session(ctx, next); err != nil {
		t.Errorf("the new session: %v", err)
	}
	if _, _, err := svc.SignIn(ctx, "ada@example.org", "correct horse", "192.0.2.1", ""); !errors.Is(err, ErrBadCredentials) {
		t.Errorf("old password: %v", err)
	}
	if _, _, err := svc.SignIn(ctx, "ada@example.org", "battery staple", "192.0.2.1", ""); err != nil {
		t.Errorf("new password: %v", err)
	}
}

func TestFailedSignInsAreLimitedPerAccountAndPerAddress(t *testing.T) {
	ctx := context.Background()
	svc, _ := newService(t, Config{})
	svc.Register(ctx, "ada@example.org", "correct horse", "192.0.2.1", "")
	for i := range SignInFailuresPerAccount {
		// From a different address each time: the account's own limit.
		addr := "203.0.113." + string(rune('1'+i))
		if _, _, err := svc.SignIn(ctx, "ada@example.org", "guess", addr, ""); !errors.Is(err, ErrBadCredentials) {
			t.Fatalf("failure %d: %v", i+1, err)
		}
	}
	_, _, err := svc.SignIn(ctx, "ada@example.org", "correct horse", "198.51.100.9", "")
	var throttled *ThrottledError
	if !errors.As(err, &throttled) || throttled.RetryAfter <= 0 || throttled.RetryAfter > LimitWindow {
		t.Fatalf("sign-in after %d failures: %v, want throttled", SignInFailuresPerAccount, err)
	}

	// One address guessing at many accounts.
	svc.Register(ctx, "bob@example.org", "correct horse", "192.0.2.1", "")
	for i := range SignInFailuresPerAddress {
		email := "guess" + string(rune('a'+i)) + "@example.org"
		if _, _, err := svc.SignIn(ctx, email, "guess", "203.0.113.99", ""); !errors.Is(err, ErrBadCredentials) {
			t.Fatalf("failure %d from one address: %v", i+1, err)
		}
	}
	if _, _, err := svc.SignIn(ctx, "bob@example.org", "correct horse", "203.0.113.99", ""); !errors.As(err, &throttled) {
		t.Errorf("sign-in from an address over its limit: %v", err)
	}
	if _, _, err := svc.SignIn(ctx, "bob@example.org", "correct horse", "192.0.2.1", ""); err != nil {
		t.Errorf("the same account from another address: %v", err)
	}
}

func TestSessionsIdleOut(t *testing.T) {
	ctx := context.Background()
	svc, st := newService(t, Config{IdleTimeout: time.Hour})
	tok, _, _ := svc.Register(ctx, "ada@example.org", "correct horse", "192.0.2.1", "")
	// The browser was last seen two hours ago.
	if err := st.TouchSession(ctx, tokenHash(tok), time.Now().Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Session(ctx, tok); !errors.Is(err, ErrNoSession) {
		t.Errorf("idle session: %v", err)
	}
}
