package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// KeyInfo is what a member may see of an API key: never its hash.
type KeyInfo struct {
	ID          string
	MemberEmail string
	CreatedAt   time.Time
	LastUsedAt  *time.Time
	RevokedAt   *time.Time
}

// Keys lists an organisation's API keys, newest first.
func (s *Store) Keys(ctx context.Context, orgID string) ([]KeyInfo, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT k.id, m.email, k.created_at, u.last_used_at, k.revoked_at
		FROM api_keys k JOIN members m ON m.id = k.member_id LEFT JOIN api_key_use u ON u.key_id = k.id
		WHERE k.org_id = ? ORDER BY k.created_at DESC, k.id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	defer rows.Close()
	var keys []KeyInfo
	for rows.Next() {
		var k KeyInfo
		var created int64
		var used, revoked sql.NullInt64
		if err := rows.Scan(&k.ID, &k.MemberEmail, &created, &used, &revoked); err != nil {
			return nil, fmt.Errorf("store: list keys: %w", err)
		}
		k.CreatedAt = time.UnixMilli(created).UTC()
		k.LastUsedAt, k.RevokedAt = fromMillis(used), fromMillis(revoked)
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	return keys, nil
}

// RevokeOrgKey revokes one of an organisation's keys; another
// organisation's key, or one revoked already, is ErrNotFound.
func (s *Store) RevokeOrgKey(ctx context.Context, orgID, keyID string, at time.Time) error {
	res, err := s.write.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND org_id = ? AND revoked_at IS NULL`,
		millis(at), keyID, orgID)
	if err := oneRow(res, err); err != nil {
		return fmt.Errorf("store: revoke key %s: %w", keyID, err)
	}
	return nil
}

// TouchKey records that a key was used at now. Callers write only when
// the stored time is a minute old (see auth.Authenticate), so a busy key
// costs one write a minute, not one per request.
func (s *Store) TouchKey(ctx context.Context, keyID string, now time.Time) error {
	if _, err := s.write.ExecContext(ctx, `INSERT INTO api_key_use (key_id, last_used_at) VALUES (?, ?)
		ON CONFLICT (key_id) DO UPDATE SET last_used_at = excluded.last_used_at`, keyID, millis(now)); err != nil {
		return fmt.Errorf("store: touch key %s: %w", keyID, err)
	}
	return nil
}
