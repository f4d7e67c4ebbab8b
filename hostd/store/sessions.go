package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Session is a signed-in browser, as stored: by the hash of its token.
type Session struct {
	User       User
	CreatedAt  time.Time
	LastSeenAt time.Time
	ExpiresAt  time.Time
}

// CreateSession stores a session of userID that ends at expires at the
// latest. replacing, when set, is the hash of a session the browser had
// before (signing in again): it is deleted in the same transaction.
func (s *Store) CreateSession(ctx context.Context, tokenHash []byte, userID string, now, expires time.Time, replacing []byte) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if replacing != nil {
			if _, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE token_hash = ?`, replacing); err != nil {
				return fmt.Errorf("store: replace session: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sessions (token_hash, user_id, created_at, last_seen_at, expires_at)
			VALUES (?, ?, ?, ?, ?)`, tokenHash, userID, millis(now), millis(now), millis(expires)); err != nil {
			return fmt.Errorf("store: create session: %w", err)
		}
		return nil
	})
}

// SessionByToken loads a live session and its user: one that has neither
// passed its absolute expiry nor been idle since idleSince. Anything else
// is ErrNotFound.
func (s *Store) SessionByToken(ctx context.Context, tokenHash []byte, now, idleSince time.Time) (Session, error) {
	var sess Session
	var created, seen, expires int64
	var u User
	var userCreated int64
	err := s.read.QueryRowContext(ctx, `SELECT s.created_at, s.last_seen_at, s.expires_at,
		u.id, u.email, u.password_hash, u.org_id, u.member_id, u.created_at
		FROM sessions s JOIN users u ON u.id = s.user_id
		WHERE s.token_hash = ? AND s.expires_at > ? AND s.last_seen_at > ?`, tokenHash, millis(now), millis(idleSince)).
		Scan(&created, &seen, &expires, &u.ID, &u.Email, &u.PasswordHash, &u.OrgID, &u.MemberID, &userCreated)
	if errors.Is(err, sql.ErrNoRows) {
		return Session{}, fmt.Errorf("store: session: %w", ErrNotFound)
	}
	if err != nil {
		return Session{}, fmt.Errorf("store: session: %w", err)
	}
	u.CreatedAt = time.UnixMilli(userCreated).UTC()
	sess.User = u
	sess.CreatedAt, sess.LastSeenAt, sess.ExpiresAt = time.UnixMilli(created).UTC(), time.UnixMilli(seen).UTC(), time.UnixMilli(expires).UTC()
	return sess, nil
}

// TouchSession records that the session was used at now, which restarts
// its idle expiry.
func (s *Store) TouchSession(ctx context.Context, tokenHash []byte, now time.Time) error {
	if _, err := s.write.ExecContext(ctx, `UPDATE sessions SET last_seen_at = ? WHERE token_hash = ?`, millis(now), tokenHash); err != nil {
		return fmt.Errorf("store: touch session: %w", err)
	}
	return nil
}

// DeleteSession ends one session (signing out). An unknown token is not an
// error: the browser is signed out either way.
func (s *Store) DeleteSession(ctx context.Context, tokenHash []byte) error {
	if _, err := s.write.ExecContext(ctx, `DELETE FROM sessions WHERE token_hash = ?`, tokenHash); err != nil {
		return fmt.Errorf("store: delete session: %w", err)
	}
	return nil
}

// DeleteUserSessions ends every session of a user except the one whose
// hash is keep (nil: all of them), as changing a password does.
func (s *Store) DeleteUserSessions(ctx context.Context, userID string, keep []byte) error {
	if _, err := s.write.ExecContext(ctx, `DELETE FROM sessions WHERE user_id = ? AND token_hash IS DISTINCT FROM ?`, userID, keep); err != nil {
		return fmt.Errorf("store: delete sessions of %s: %w", userID, err)
	}
	return nil
}

// DeleteExpiredSessions removes sessions past their absolute expiry or
// idle since idleSince; it returns how many.
func (s *Store) DeleteExpiredSessions(ctx context.Context, now, idleSince time.Time) (int64, error) {
	res, err := s.write.ExecContext(ctx, `DELETE FROM sessions WHERE expires_at <= ? OR last_seen_at <= ?`, millis(now), millis(idleSince))
	if err != nil {
		return 0, fmt.Errorf("store: delete expired sessions: %w", err)
	}
	return res.RowsAffected()
}

// Attempts is the number of attempts counted under key in its current
// window, and when that window started; a window that started at or before
// windowStart has ended and counts none.
func (s *Store) Attempts(ctx context.Context, key string, windowStart time.Time) (attempts int, started time.Time, err error) {
	var start int64
	err = s.read.QueryRowContext(ctx, `SELECT attempts, window_start FROM auth_attempts WHERE key = ? AND window_start > ?`,
		key, millis(windowStart)).Scan(&attempts, &start)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("store: attempts: %w", err)
	}
	return attempts, time.UnixMilli(start).UTC(), nil
}

// RecordAttempt counts one attempt under each key, starting a new window
// at now for a key whose window began at or before windowStart.
func (s *Store) RecordAttempt(ctx context.Context, now, windowStart time.Time, keys ...string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		for _, key := range keys {
			if _, err := tx.ExecContext(ctx, `INSERT INTO auth_attempts (key, window_start, attempts) VALUES (?1, ?2, 1)
				ON CONFLICT (key) DO UPDATE SET
					attempts = CASE WHEN auth_attempts.window_start > ?3 THEN auth_attempts.attempts + 1 ELSE 1 END,
					window_start = CASE WHEN auth_attempts.window_start > ?3 THEN auth_attempts.window_start ELSE ?2 END`,
				key, millis(now), millis(windowStart)); err != nil {
				return fmt.Errorf("store: record attempt: %w", err)
			}
		}
		// Windows that ended are of no use to anyone.
		if _, err := tx.ExecContext(ctx, `DELETE FROM auth_attempts WHERE window_start <= ?`, millis(windowStart)); err != nil {
			return fmt.Errorf("store: forget old attempts: %w", err)
		}
		return nil
	})
}

// ClearAttempts forgets the attempts counted under key.
func (s *Store) ClearAttempts(ctx context.Context, key string) error {
	if _, err := s.write.ExecContext(ctx, `DELETE FROM auth_attempts WHERE key = ?`, key); err != nil {
		return fmt.Errorf("store: clear attempts: %w", err)
	}
	return nil
}
