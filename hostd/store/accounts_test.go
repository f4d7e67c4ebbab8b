package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/pgtest"
)

func openTestStore(t *testing.T) *Store {
	t.Helper()
	st, _ := openTestStoreAt(t)
	return st
}

// openTestStoreAt opens an empty store in the dialect this test binary
// runs against (EPHEMERAL_TEST_DATABASE=postgres: a fresh database in a
// throwaway PostgreSQL cluster; else an SQLite file) and returns with it
// what reopenTestStore needs to open it again. Package storetest does this
// for other packages; the store's own tests cannot import it.
func openTestStoreAt(t *testing.T) (*Store, string) {
	t.Helper()
	var (
		st  *Store
		at  string
		err error
	)
	if os.Getenv("EPHEMERAL_TEST_DATABASE") == "postgres" {
		at = pgtest.Shared(t).NewDatabase(t)
		st, err = OpenPostgres(context.Background(), at)
	} else {
		at = filepath.Join(t.TempDir(), "ephemeral.db")
		st, err = Open(context.Background(), at)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, at
}

// reopenTestStore opens the database openTestStoreAt returned again, as
// a restarted daemon would.
func reopenTestStore(t *testing.T, at string) *Store {
	t.Helper()
	var (
		st  *Store
		err error
	)
	if IsPostgresURL(at) {
		st, err = OpenPostgres(context.Background(), at)
	} else {
		st, err = Open(context.Background(), at)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestMain(m *testing.M) { pgtest.RunMain(m) }

func TestCreateAccountMakesAFundedOrganisationWithOneMember(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	// An organisation an admin created earlier holds the name the
	// registration would take.
	if _, err := st.CreateOrg(ctx, "ada@example.org"); err != nil {
		t.Fatal(err)
	}
	u, err := st.CreateAccount(ctx, NewAccount{Email: "ada@example.org", PasswordHash: "h", StarterCredit: 1_000_000, At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	bal, err := st.Balance(ctx, u.OrgID)
	if err != nil || bal.Available != 1_000_000 {
		t.Fatalf("balance %+v, %v; want $1.00 available", bal, err)
	}
	if _, err := st.OrgByName(ctx, "ada@example.org-2"); err != nil {
		t.Errorf("organisation not named after the email, made unique: %v", err)
	}
	if m, err := st.MemberByEmail(ctx, u.OrgID, "ada@example.org"); err != nil || m.ID != u.MemberID {
		t.Errorf("member %+v, %v; want %s", m, err, u.MemberID)
	}
	// The email is one account however it is capitalised.
	if _, err := st.CreateAccount(ctx, NewAccount{Email: "ADA@Example.org", PasswordHash: "h", At: time.Now()}); !errors.Is(err, ErrEmailTaken) {
		t.Errorf("second registration: %v, want ErrEmailTaken", err)
	}
	got, err := st.UserByEmail(ctx, "Ada@EXAMPLE.org")
	if err != nil || got.ID != u.ID || got.OrgID != u.OrgID {
		t.Errorf("user by other capitalisation: %+v, %v", got, err)
	}
}

func TestSessionsExpireWhenIdleOrOld(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	u, err := st.CreateAccount(ctx, NewAccount{Email: "a@x.org", PasswordHash: "h", At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok := []byte("token-1")
	if err := st.CreateSession(ctx, tok, u.ID, now, now.Add(30*24*time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	idle := 7 * 24 * time.Hour
	live := func(at time.Time) bool {
		_, err := st.SessionByToken(ctx, tok, at, at.Add(-idle))
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	if !live(now.Add(time.Hour)) {
		t.Fatal("fresh session not found")
	}
	if live(now.Add(8 * 24 * time.Hour)) {
		t.Error("session idle for 8 days still live")
	}
	// Used every 6 days it stays live until its absolute expiry.
	for d := 6; d < 30; d += 6 {
		at := now.Add(time.Duration(d) * 24 * time.Hour)
		if !live(at) {
			t.Fatalf("session used regularly dead after %d days", d)
		}
		if err := st.TouchSession(ctx, tok, at); err != nil {
			t.Fatal(err)
		}
	}
	if live(now.Add(30*24*time.Hour + time.Minute)) {
		t.Error("session live past its absolute expiry")
	}
	if n, err := st.DeleteExpiredSessions(ctx, now.Add(31*24*time.Hour), now.Add(31*24*time.Hour-idle)); err != nil || n != 1 {
		t.Errorf("expired sessions deleted: %d, %v", n, err)
	}
}

func TestSigningInAgainReplacesTheOldSession(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	u, _ := st.CreateAccount(ctx, NewAccount{Email: "a@x.org", PasswordHash: "h", At: time.Now()})
	now := time.Now()
	st.CreateSession(ctx, []byte("old"), u.ID, now, now.Add(time.Hour), nil)
	st.CreateSession(ctx, []byte("other-browser"), u.ID, now, now.Add(time.Hour), nil)
	if err := st.CreateSession(ctx, []byte("new"), u.ID, now, now.Add(time.Hour), []byte("old")); err != nil {
		t.Fatal(err)
	}
	has := func(tok string) bool {
		_, err := st.SessionByToken(ctx, []byte(tok), now, now.Add(-time.Hour))
		return err == nil
	}
	if has("old") || !has("new") || !has("other-browser") {
		t.Fatalf("after rotation: old %v, new %v, other %v", has("old"), has("new"), has("other-browser"))
	}
	if err := st.DeleteUserSessions(ctx, u.ID, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if !has("new") || has("other-browser") {
		t.Errorf("after ending the others: new %v, other %v", has("new"), has("other-browser"))
	}
}

func TestAttemptsCountPerWindow(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	window := 15 * time.Minute
	t0 := time.Now()
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Minute)
		if err := st.RecordAttempt(ctx, at, at.Add(-window), "account:a", "address:1.2.3.4"); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(5 * time.Minute)
	n, started, err := st.Attempts(ctx, "account:a", now.Add(-window))
	if err != nil || n != 3 || !started.Equal(t0.UTC().Truncate(time.Millisecond)) {
		t.Fatalf("attempts %d since %v, %v; want 3 since %v", n, started, err, t0)
	}
	// The window ends 15 minutes after its first failure.
	later := t0.Add(16 * time.Minute)
	if n, _, _ := st.Attempts(ctx, "account:a", later.Add(-window)); n != 0 {
		t.Errorf("failures in a new window: %d", n)
	}
	st.RecordAttempt(ctx, later, later.Add(-window), "account:a")
	if n, _, _ := st.Attempts(ctx, "account:a", later.Add(-window)); n != 1 {
		t.Errorf("first failure of a new window counted %d", n)
	}
	st.ClearAttempts(ctx, "account:a")
	if n, _, _ := st.Attempts(ctx, "account:a", later.Add(-window)); n != 0 {
		t.Errorf("failures after clearing: %d", n)
	}
}

func TestKeysAreListedAndRevokedWithinTheirOrganisation(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	a, _ := st.CreateAccount(ctx, NewAccount{Email: "a@x.org", PasswordHash: "h", At: time.Now()})
	b, _ := st.CreateAccount(ctx, NewAccount{Email: "b@x.org", PasswordHash: "h", At: time.Now()})
	if err := st.AddKey(ctx, Member{ID: a.MemberID, OrgID: a.OrgID}, "aaaaaaaaaaaaaaaa", []byte("hash")); err != nil {
		t.Fatal(err)
	}
	if keys, _ := st.Keys(ctx, b.OrgID); len(keys) != 0 {
		t.Errorf("another organisation lists %+v", keys)
	}
	if err := st.RevokeOrgKey(ctx, b.OrgID, "aaaaaaaaaaaaaaaa", time.Now()); !errors.Is(err, ErrNotFound) {
		t.Errorf("another organisation revoked the key: %v", err)
	}
	used := time.Now().Add(-time.Minute)
	if err := st.TouchKey(ctx, "aaaaaaaaaaaaaaaa", used); err != nil {
		t.Fatal(err)
	}
	keys, err := st.Keys(ctx, a.OrgID)
	if err != nil || len(keys) != 1 || keys[0].MemberEmail != "a@x.org" || keys[0].LastUsedAt == nil ||
		!keys[0].LastUsedAt.Equal(used.UTC().Truncate(time.Millisecond)) || keys[0].RevokedAt != nil {
		t.Fatalf("keys %+v, %v", keys, err)
	}
	if err := st.RevokeOrgKey(ctx, a.OrgID, "aaaaaaaaaaaaaaaa", time.Now()); err != nil {
		t.Fatal(err)
	}
	if k, _ := st.KeyByID(ctx, "aaaaaaaaaaaaaaaa"); !k.Revoked {
		t.Error("revoked key still valid")
	}
}

func TestPublishedRunsEndWithTheirContent(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	st := f.st
	f.queue("run_active", false)
	if _, err := st.PublishRun(ctx, f.orgID, "run_active", "slug-active", time.Now()); !errors.Is(err, ErrActive) {
		t.Errorf("publishing an active run: %v", err)
	}
	f.queue("run_zdr", true)
	f.finish("run_zdr", time.Now().Add(time.Hour))
	if _, err := st.PublishRun(ctx, f.orgID, "run_zdr", "slug-zdr", time.Now()); !errors.Is(err, ErrZeroRetention) {
		t.Errorf("publishing a zero-data-retention run: %v", err)
	}

	f.queue("run_a", false)
	f.finish("run_a", time.Now().Add(time.Hour))
	other, _ := st.CreateOrg(ctx, "other")
	if _, err := st.PublishRun(ctx, other.ID, "run_a", "slug-other", time.Now()); !errors.Is(err, ErrNotFound) {
		t.Errorf("another organisation published the run: %v", err)
	}
	p, err := st.PublishRun(ctx, f.orgID, "run_a", "slug-a", time.Now())
	if err != nil || p.Slug != "slug-a" {
		t.Fatalf("publish: %+v, %v", p, err)
	}
	// Publishing again keeps the link.
	if again, err := st.PublishRun(ctx, f.orgID, "run_a", "slug-b", time.Now()); err != nil || again.Slug != "slug-a" {
		t.Errorf("publishing again: %+v, %v", again, err)
	}
	if r, err := st.PublishedRun(ctx, "slug-a"); err != nil || r.ID != "run_a" {
		t.Fatalf("published run: %+v, %v", r, err)
	}
	if err := st.UnpublishRun(ctx, f.orgID, "run_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PublishedRun(ctx, "slug-a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unpublished run still served: %v", err)
	}

	// Purging (delete, or the end of retention) unpublishes.
	if _, err := st.PublishRun(ctx, f.orgID, "run_a", "slug-c", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PurgeRun(ctx, f.orgID, "run_a", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PublishedRun(ctx, "slug-c"); !errors.Is(err, ErrNotFound) {
		t.Errorf("purged run still served: %v", err)
	}
	if _, err := st.PublicationOf(ctx, f.orgID, "run_a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("purged run still published: %v", err)
	}
	if _, err := st.PublishRun(ctx, f.orgID, "run_a", "slug-d", time.Now()); !errors.Is(err, ErrPurged) {
		t.Errorf("publishing a purged run: %v", err)
	}
}

func TestListRunsWithStatus(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	f.queue("run_1", false)
	f.queue("run_2", false)
	f.finish("run_1", time.Now().Add(time.Hour))
	list, more, err := f.st.ListRunsWithStatus(ctx, f.orgID, Succeeded, "", 10)
	if err != nil || more || len(list) != 1 || list[0].ID != "run_1" {
		t.Fatalf("succeeded runs: %+v %v %v", list, more, err)
	}
	list, _, _ = f.st.ListRunsWithStatus(ctx, f.orgID, "", "", 10)
	if len(list) != 2 {
		t.Fatalf("all runs: %d", len(list))
	}
}
