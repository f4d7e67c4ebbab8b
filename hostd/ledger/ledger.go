// Package ledger is where Ephemeral's money is enforced: organisation
// accounts (available balance, holds, charges) that never lose or double a
// micro-dollar, and the per-run Meter that refuses any charge beyond the
// run's budget.
//
// Every amount is an integer number of micro-dollars. For each account
// available + held + charged == credited holds after every transaction; the
// SQL below moves money between those columns, never creates or drops it.
// The tables, with that invariant as a CHECK constraint, are created by
// the store's migrations.
package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrInsufficientFunds means the organisation's available balance cannot
// cover a reservation.
var ErrInsufficientFunds = errors.New("ledger: insufficient funds")

// Account is an organisation's money at one moment.
type Account struct {
	Available int64 `json:"available_micros"`
	Held      int64 `json:"held_micros"`
	Charged   int64 `json:"charged_micros"`
	Credited  int64 `json:"credited_micros"`
}

// OpenAccount creates a zero account for a new organisation.
func OpenAccount(ctx context.Context, tx *sql.Tx, orgID string) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO accounts (org_id) VALUES (?)`, orgID); err != nil {
		return fmt.Errorf("ledger: open account %s: %w", orgID, err)
	}
	return nil
}

// Credit adds money to the organisation's available balance.
func Credit(ctx context.Context, tx *sql.Tx, orgID string, micros int64) error {
	if micros <= 0 {
		return fmt.Errorf("ledger: credit %d micros: amount must be positive", micros)
	}
	res, err := tx.ExecContext(ctx,
		`UPDATE accounts SET available = available + ?1, credited = credited + ?1 WHERE org_id = ?2`, micros, orgID)
	if err := oneRow(res, err); err != nil {
		return fmt.Errorf("ledger: credit %s: %w", orgID, err)
	}
	return entry(ctx, tx, orgID, "", "credit", micros)
}

// Reserve moves micros from available to held for a run, or fails with
// ErrInsufficientFunds. The check and the move are one UPDATE, so two
// concurrent reservations can never both spend the same money.
func Reserve(ctx context.Context, tx *sql.Tx, orgID, runID string, micros int64) error {
	if micros <= 0 {
		return fmt.Errorf("ledger: reserve %d micros: amount must be positive", micros)
	}
	res, err := tx.ExecContext(ctx,
		`UPDATE accounts SET available = available - ?1, held = held + ?1 WHERE org_id = ?2 AND available >= ?1`,
		micros, orgID)
	if err != nil {
		return fmt.Errorf("ledger: reserve for %s: %w", runID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("ledger: reserve for %s: %w", runID, err)
	} else if n == 0 {
		return ErrInsufficientFunds
	}
	return entry(ctx, tx, orgID, runID, "hold", micros)
}

// Settle closes a run's hold: charge moves from held to charged, the rest of
// the hold goes back to available. The charge is capped at the hold, so a run
// can never cost more than it reserved.
func Settle(ctx context.Context, tx *sql.Tx, orgID, runID string, hold, charge int64) (charged, released int64, err error) {
	charge = max(0, min(charge, hold))
	release := hold - charge
	res, err := tx.ExecContext(ctx,
		`UPDATE accounts SET held = held - ?1, charged = charged + ?2, available = available + ?3 WHERE org_id = ?4`,
		hold, charge, release, orgID)
	if err := oneRow(res, err); err != nil {
		return 0, 0, fmt.Errorf("ledger: settle %s: %w", runID, err)
	}
	if err := entry(ctx, tx, orgID, runID, "charge", charge); err != nil {
		return 0, 0, err
	}
	if err := entry(ctx, tx, orgID, runID, "release", release); err != nil {
		return 0, 0, err
	}
	return charge, release, nil
}

// Balance reads an organisation's account.
func Balance(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, orgID string) (Account, error) {
	var a Account
	err := q.QueryRowContext(ctx, `SELECT available, held, charged, credited FROM accounts WHERE org_id = ?`, orgID).
		Scan(&a.Available, &a.Held, &a.Charged, &a.Credited)
	if err != nil {
		return Account{}, fmt.Errorf("ledger: balance of %s: %w", orgID, err)
	}
	return a, nil
}

func entry(ctx context.Context, tx *sql.Tx, orgID, runID, kind string, micros int64) error {
	var run any
	if runID != "" {
		run = runID
	}
	_, err := tx.ExecContext(ctx,
		`INSERT INTO ledger_entries (org_id, run_id, kind, micros, created_at) VALUES (?, ?, ?, ?, ?)`,
		orgID, run, kind, micros, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("ledger: record %s entry: %w", kind, err)
	}
	return nil
}

func oneRow(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n != 1 {
		return sql.ErrNoRows
	}
	return nil
}
