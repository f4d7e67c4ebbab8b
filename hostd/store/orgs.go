package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
)

// Org is a customer organisation; its money lives in its ledger account.
type Org struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// Member is a person in an organisation who may hold API keys.
type Member struct {
	ID        string
	OrgID     string
	Email     string
	CreatedAt time.Time
}

// APIKey is a stored key: only the hash of the secret is kept.
type APIKey struct {
	ID       string
	OrgID    string
	MemberID string
	Hash     []byte
	Revoked  bool
	// LastUsedAt is nil for a key never used; it is updated at most
	// once a minute (see TouchKey).
	LastUsedAt *time.Time
}

func newID(prefix string, bytes int) string {
	b := make([]byte, bytes)
	rand.Read(b) // never fails (crypto/rand panics rather than return an error)
	return prefix + hex.EncodeToString(b)
}

// CreateOrg creates an organisation with an empty account. A name taken
// already is ErrExists.
func (s *Store) CreateOrg(ctx context.Context, name string) (Org, error) {
	o := Org{ID: newID("org_", 8), Name: name, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockNames(ctx, tx); err != nil {
			return err
		}
		var taken bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM orgs WHERE name = ?)`, name).Scan(&taken); err != nil {
			return fmt.Errorf("store: create org %q: %w", name, err)
		}
		if taken {
			return fmt.Errorf("store: create org %q: %w", name, ErrExists)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orgs (id, name, created_at) VALUES (?, ?, ?)`,
			o.ID, o.Name, millis(o.CreatedAt)); err != nil {
			return fmt.Errorf("store: create org %q: %w", name, err)
		}
		return ledger.OpenAccount(ctx, tx, o.ID)
	})
	return o, err
}

// OrgByName finds an organisation by its unique name.
func (s *Store) OrgByName(ctx context.Context, name string) (Org, error) {
	var o Org
	var created int64
	err := s.read.QueryRowContext(ctx, `SELECT id, name, created_at FROM orgs WHERE name = ?`, name).
		Scan(&o.ID, &o.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Org{}, fmt.Errorf("store: org %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Org{}, fmt.Errorf("store: org %q: %w", name, err)
	}
	o.CreatedAt = time.UnixMilli(created).UTC()
	return o, nil
}

// OrgsPage returns up to limit organisations in name order, starting after
// the name after (empty: from the first), and whether more follow.
func (s *Store) OrgsPage(ctx context.Context, after string, limit int) ([]Org, bool, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT id, name, created_at FROM orgs WHERE name > ? ORDER BY name LIMIT ?`,
		after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("store: list orgs: %w", err)
	}
	defer rows.Close()
	var orgs []Org
	for rows.Next() {
		var o Org
		var created int64
		if err := rows.Scan(&o.ID, &o.Name, &created); err != nil {
			return nil, false, fmt.Errorf("store: list orgs: %w", err)
		}
		o.CreatedAt = time.UnixMilli(created).UTC()
		orgs = append(orgs, o)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("store: list orgs: %w", err)
	}
	if len(orgs) > limit {
		return orgs[:limit], true, nil
	}
	return orgs, false, nil
}

// AddMember adds a member to an organisation; an email that is a member's
// of the organisation already is ErrExists.
func (s *Store) AddMember(ctx context.Context, orgID, email string) (Member, error) {
	m := Member{ID: newID("mem_", 8), OrgID: orgID, Email: email, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockOrg(ctx, tx, orgID); err != nil {
			return err
		}
		var taken bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM members WHERE org_id = ? AND email = ?)`,
			orgID, email).Scan(&taken); err != nil {
			return fmt.Errorf("store: add member %q: %w", email, err)
		}
		if taken {
			return fmt.Errorf("store: add member %q: %w", email, ErrExists)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO members (id, org_id, email, created_at) VALUES (?, ?, ?, ?)`,
			m.ID, orgID, email, millis(m.CreatedAt)); err != nil {
			return fmt.Errorf("store: add member %q: %w", email, err)
		}
		return nil
	})
	if err != nil {
		return Member{}, err
	}
	return m, nil
}

// Members lists an organisation's members in email order.
func (s *Store) Members(ctx context.Context, orgID string) ([]Member, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT id, email, created_at FROM members WHERE org_id = ? ORDER BY email`, orgID)
	if err != nil {
		return nil, fmt.Errorf("store: list members: %w", err)
	}
	defer rows.Close()
	var members []Member
	for rows.Next() {
		m := Member{OrgID: orgID}
		var created int64
		if err := rows.Scan(&m.ID, &m.Email, &created); err != nil {
			return nil, fmt.Errorf("store: list members: %w", err)
		}
		m.CreatedAt = time.UnixMilli(created).UTC()
		members = append(members, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list members: %w", err)
	}
	return members, nil
}

// MemberByEmail finds a member of an organisation.
func (s *Store) MemberByEmail(ctx context.Context, orgID, email string) (Member, error) {
	m := Member{OrgID: orgID, Email: email}
	err := s.read.QueryRowContext(ctx, `SELECT id FROM members WHERE org_id = ? AND email = ?`, orgID, email).Scan(&m.ID)
	if errors.Is(err, sql.ErrNoRows) {
		return Member{}, fmt.Errorf("store: member %q: %w", email, ErrNotFound)
	}
	if err != nil {
		return Member{}, fmt.Errorf("store: member %q: %w", email, err)
	}
	return m, nil
}

// AddKey stores a key's id and hash for a member.
func (s *Store) AddKey(ctx context.Context, m Member, keyID string, hash []byte) error {
	_, err := s.write.ExecContext(ctx,
		`INSERT INTO api_keys (id, member_id, org_id, hash, created_at) VALUES (?, ?, ?, ?, ?)`,
		keyID, m.ID, m.OrgID, hash, millis(time.Now()))
	if err != nil {
		return fmt.Errorf("store: add key: %w", err)
	}
	return nil
}

// RevokeKey marks a key revoked; it stops working immediately.
func (s *Store) RevokeKey(ctx context.Context, keyID string) error {
	res, err := s.write.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL`,
		millis(time.Now()), keyID)
	if err := oneRow(res, err); err != nil {
		return fmt.Errorf("store: revoke key %s: %w", keyID, err)
	}
	return nil
}

// KeyByID loads a key for authentication.
func (s *Store) KeyByID(ctx context.Context, keyID string) (APIKey, error) {
	k := APIKey{ID: keyID}
	var revoked, used sql.NullInt64
	err := s.read.QueryRowContext(ctx, `SELECT org_id, member_id, hash, revoked_at,
		(SELECT last_used_at FROM api_key_use WHERE key_id = api_keys.id) FROM api_keys WHERE id = ?`, keyID).
		Scan(&k.OrgID, &k.MemberID, &k.Hash, &revoked, &used)
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, fmt.Errorf("store: key %s: %w", keyID, ErrNotFound)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("store: key %s: %w", keyID, err)
	}
	k.Revoked = revoked.Valid
	k.LastUsedAt = fromMillis(used)
	return k, nil
}

// Credit adds micros to an organisation's balance.
func (s *Store) Credit(ctx context.Context, orgID string, micros int64) (ledger.Account, error) {
	var a ledger.Account
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := ledger.Credit(ctx, tx, orgID, micros); err != nil {
			return err
		}
		var err error
		a, err = ledger.Balance(ctx, tx, orgID)
		return err
	})
	return a, err
}

// Balance reads an organisation's account.
func (s *Store) Balance(ctx context.Context, orgID string) (ledger.Account, error) {
	return ledger.Balance(ctx, s.read, orgID)
}

func oneRow(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}
