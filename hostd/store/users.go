package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
)

// User is a person who signs in to the web app: the member of the
// organisation created when they registered.
type User struct {
	ID           string
	Email        string
	PasswordHash string
	OrgID        string
	MemberID     string
	CreatedAt    time.Time
}

// ErrEmailTaken means an account with that email (in any capitalisation)
// exists.
var ErrEmailTaken = errors.New("an account with this email exists")

// NewAccount is what CreateAccount stores.
type NewAccount struct {
	Email        string
	PasswordHash string
	// StarterCredit is credited to the new organisation's balance.
	StarterCredit int64
	At            time.Time
}

const userColumns = `id, email, password_hash, org_id, member_id, created_at`

func scanUser(row scanner) (User, error) {
	var u User
	var created int64
	if err := row.Scan(&u.ID, &u.Email, &u.PasswordHash, &u.OrgID, &u.MemberID, &created); err != nil {
		return User{}, err
	}
	u.CreatedAt = time.UnixMilli(created).UTC()
	return u, nil
}

// CreateAccount creates, in one transaction, an organisation named after
// the email (made unique), its account credited with the starter credit,
// a member and the user who signs in as that member. It fails with
// ErrEmailTaken when the email is registered already.
func (s *Store) CreateAccount(ctx context.Context, a NewAccount) (User, error) {
	u := User{ID: newID("usr_", 8), Email: a.Email, PasswordHash: a.PasswordHash, MemberID: newID("mem_", 8),
		OrgID: newID("org_", 8), CreatedAt: a.At.UTC().Truncate(time.Millisecond)}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockNames(ctx, tx); err != nil {
			return err
		}
		var taken bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM users WHERE email = ?)`, a.Email).Scan(&taken); err != nil {
			return fmt.Errorf("store: create account: %w", err)
		}
		if taken {
			return ErrEmailTaken
		}
		name, err := freeOrgName(ctx, tx, a.Email)
		if err != nil {
			return err
		}
		at := millis(a.At)
		if _, err := tx.ExecContext(ctx, `INSERT INTO orgs (id, name, created_at) VALUES (?, ?, ?)`, u.OrgID, name, at); err != nil {
			return fmt.Errorf("store: create account's organisation: %w", err)
		}
		if err := ledger.OpenAccount(ctx, tx, u.OrgID); err != nil {
			return err
		}
		if a.StarterCredit > 0 {
			if err := ledger.Credit(ctx, tx, u.OrgID, a.StarterCredit); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO members (id, org_id, email, created_at) VALUES (?, ?, ?, ?)`,
			u.MemberID, u.OrgID, a.Email, at); err != nil {
			return fmt.Errorf("store: create account's member: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO users (id, email, password_hash, org_id, member_id, created_at,
			password_changed_at) VALUES (?, ?, ?, ?, ?, ?, ?)`, u.ID, a.Email, a.PasswordHash, u.OrgID, u.MemberID, at, at); err != nil {
			return fmt.Errorf("store: create user: %w", err)
		}
		return nil
	})
	if err != nil {
		return User{}, err
	}
	return u, nil
}

// freeOrgName is base, or base-2, base-3... whichever no organisation has.
func freeOrgName(ctx context.Context, tx *sql.Tx, base string) (string, error) {
	for i := 1; i <= 1000; i++ {
		name := base
		if i > 1 {
			name = base + "-" + strconv.Itoa(i)
		}
		var taken bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM orgs WHERE name = ?)`, name).Scan(&taken); err != nil {
			return "", fmt.Errorf("store: find an organisation name: %w", err)
		}
		if !taken {
			return name, nil
		}
	}
	return "", fmt.Errorf("store: no free organisation name for %q", base)
}

// UserByEmail finds a user by email, in any capitalisation.
func (s *Store) UserByEmail(ctx context.Context, email string) (User, error) {
	u, err := scanUser(s.read.QueryRowContext(ctx, `SELECT `+userColumns+` FROM users WHERE email = ?`, email))
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, fmt.Errorf("store: user %q: %w", email, ErrNotFound)
	}
	if err != nil {
		return User{}, fmt.Errorf("store: user %q: %w", email, err)
	}
	return u, nil
}

// SetPassword replaces a user's password hash.
func (s *Store) SetPassword(ctx context.Context, userID, hash string, at time.Time) error {
	res, err := s.write.ExecContext(ctx, `UPDATE users SET password_hash = ?, password_changed_at = ? WHERE id = ?`,
		hash, millis(at), userID)
	if err := oneRow(res, err); err != nil {
		return fmt.Errorf("store: set password of %s: %w", userID, err)
	}
	return nil
}
