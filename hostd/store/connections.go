package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ConnectionRecord is an organisation's connection to an outside system as
// stored: the secret headers only in sealed form (see package seal), which
// this package never opens.
type ConnectionRecord struct {
	OrgID         string
	Name          string
	BaseURL       string
	Methods       []string // the most a run of the organisation may be granted
	SealedHeaders []byte
	CreatedAt     time.Time
}

// ErrConnectionExists is returned when an organisation already has a
// connection of that name.
var ErrConnectionExists = errors.New("connection already exists")

// AddConnection stores c; it fails with ErrConnectionExists rather than
// silently replacing a secret.
func (s *Store) AddConnection(ctx context.Context, c ConnectionRecord) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockOrg(ctx, tx, c.OrgID); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM connections WHERE org_id = ? AND name = ?`,
			c.OrgID, c.Name).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return ErrConnectionExists
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO connections (org_id, name, base_url, methods, sealed_headers, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			c.OrgID, c.Name, c.BaseURL, strings.Join(c.Methods, ","), c.SealedHeaders, millis(c.CreatedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("store: add connection %q: %w", c.Name, err)
	}
	return nil
}

// Connection loads one connection of an organisation.
func (s *Store) Connection(ctx context.Context, orgID, name string) (ConnectionRecord, error) {
	c := ConnectionRecord{OrgID: orgID, Name: name}
	var methods string
	var created int64
	err := s.read.QueryRowContext(ctx,
		`SELECT base_url, methods, sealed_headers, created_at FROM connections WHERE org_id = ? AND name = ?`,
		orgID, name).Scan(&c.BaseURL, &methods, &c.SealedHeaders, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return ConnectionRecord{}, fmt.Errorf("store: connection %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return ConnectionRecord{}, fmt.Errorf("store: connection %q: %w", name, err)
	}
	c.Methods = splitMethods(methods)
	c.CreatedAt = time.UnixMilli(created).UTC()
	return c, nil
}

// Connections lists an organisation's connections by name, without their
// sealed headers.
func (s *Store) Connections(ctx context.Context, orgID string) ([]ConnectionRecord, error) {
	rows, err := s.read.QueryContext(ctx,
		`SELECT name, base_url, methods, created_at FROM connections WHERE org_id = ? ORDER BY name`, orgID)
	if err != nil {
		return nil, fmt.Errorf("store: list connections: %w", err)
	}
	defer rows.Close()
	var out []ConnectionRecord
	for rows.Next() {
		c := ConnectionRecord{OrgID: orgID}
		var methods string
		var created int64
		if err := rows.Scan(&c.Name, &c.BaseURL, &methods, &created); err != nil {
			return nil, fmt.Errorf("store: list connections: %w", err)
		}
		c.Methods = splitMethods(methods)
		c.CreatedAt = time.UnixMilli(created).UTC()
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list connections: %w", err)
	}
	return out, nil
}

// RemoveConnection deletes a connection. Runs already started keep what
// the broker loaded for them at their start; new runs cannot be granted it.
func (s *Store) RemoveConnection(ctx context.Context, orgID, name string) error {
	res, err := s.write.ExecContext(ctx, `DELETE FROM connections WHERE org_id = ? AND name = ?`, orgID, name)
	if err := oneRow(res, err); err != nil {
		return fmt.Errorf("store: remove connection %q: %w", name, err)
	}
	return nil
}

func splitMethods(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
