package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// openDB opens a real SQLite file, created with the store's schema, with
// several connections, so concurrent transactions really contend for
// SQLite's write lock (the store itself would queue them on one); or,
// under EPHEMERAL_TEST_DATABASE=postgres, the store's PostgreSQL pool,
// whose connections contend for the account's row.
func openDB(t *testing.T) *sql.DB {
	t.Helper()
	if storetest.Postgres() {
		st, _ := storetest.Open(t)
		return st.DB()
	}
	path := filepath.Join(t.TempDir(), "ledger.db")
	st, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func inTx(t *testing.T, db *sql.DB, fn func(*sql.Tx) error) error {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func TestFiftyReservationsAgainstABalanceForTen(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	if err := inTx(t, db, func(tx *sql.Tx) error {
		if err := ledger.OpenAccount(ctx, tx, "org"); err != nil {
			return err
		}
		return ledger.Credit(ctx, tx, "org", 10*40000)
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]error, 50)
	for i := range 50 {
		wg.Go(func() {
			results[i] = inTx(t, db, func(tx *sql.Tx) error {
				return ledger.Reserve(ctx, tx, "org", fmt.Sprint("run_", i), 40000)
			})
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range results {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, ledger.ErrInsufficientFunds):
			t.Fatalf("unexpected error: %v", err)
		}
	}
	if ok != 10 {
		t.Fatalf("%d reservations succeeded, want exactly 10", ok)
	}
	a, err := ledger.Balance(ctx, db, "org")
	if err != nil {
		t.Fatal(err)
	}
	if a != (ledger.Account{Available: 0, Held: 400000, Charged: 0, Credited: 400000}) {
		t.Fatalf("account %+v", a)
	}
	var holds int64
	if err := db.QueryRow(`SELECT sum(micros) FROM ledger_entries WHERE kind = 'hold'`).Scan(&holds); err != nil || holds != 400000 {
		t.Fatalf("hold entries sum %d (%v)", holds, err)
	}
}

func TestSettleChargesAtMostTheHoldAndConservesMoney(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	steps := []func(*sql.Tx) error{
		func(tx *sql.Tx) error { return ledger.OpenAccount(ctx, tx, "org") },
		func(tx *sql.Tx) error { return ledger.Credit(ctx, tx, "org", 100000) },
		func(tx *sql.Tx) error { return ledger.Reserve(ctx, tx, "org", "run_a", 40000) },
		func(tx *sql.Tx) error { return ledger.Reserve(ctx, tx, "org", "run_b", 40000) },
	}
	for _, step := range steps {
		if err := inTx(t, db, step); err != nil {
			t.Fatal(err)
		}
	}
	var charged, released int64
	if err := inTx(t, db, func(tx *sql.Tx) (err error) {
		charged, released, err = ledger.Settle(ctx, tx, "org", "run_a", 40000, 3530)
		return err
	}); err != nil || charged != 3530 || released != 36470 {
		t.Fatalf("settle a: %d %d %v", charged, released, err)
	}
	// A charge above the hold is capped: a run never costs more than it reserved.
	if err := inTx(t, db, func(tx *sql.Tx) (err error) {
		charged, released, err = ledger.Settle(ctx, tx, "org", "run_b", 40000, 99999)
		return err
	}); err != nil || charged != 40000 || released != 0 {
		t.Fatalf("settle b: %d %d %v", charged, released, err)
	}
	a, err := ledger.Balance(ctx, db, "org")
	if err != nil {
		t.Fatal(err)
	}
	if a != (ledger.Account{Available: 100000 - 43530, Held: 0, Charged: 43530, Credited: 100000}) {
		t.Fatalf("account %+v", a)
	}
	if err := inTx(t, db, func(tx *sql.Tx) error { return ledger.Reserve(ctx, tx, "org", "run_c", 60000) }); !errors.Is(err, ledger.ErrInsufficientFunds) {
		t.Fatalf("overdraw: %v", err)
	}
	for _, bad := range []int64{0, -1} {
		if err := inTx(t, db, func(tx *sql.Tx) error { return ledger.Credit(ctx, tx, "org", bad) }); err == nil {
			t.Fatalf("credit %d accepted", bad)
		}
		if err := inTx(t, db, func(tx *sql.Tx) error { return ledger.Reserve(ctx, tx, "org", "run_d", bad) }); err == nil {
			t.Fatalf("reserve %d accepted", bad)
		}
	}
}
