package flock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestExclusiveExcludesEveryOtherLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	held, err := TryLock(path, Exclusive)
	if err != nil {
		t.Fatalf("TryLock on a new file: %v", err)
	}
	for _, mode := range []Mode{Exclusive, Shared} {
		f, err := TryLock(path, mode)
		if err == nil {
			f.Close()
			t.Fatalf("TryLock(%d) succeeded while an exclusive lock is held", mode)
		}
		if !errors.Is(err, ErrHeld) {
			t.Errorf("TryLock(%d) = %v, want it to wrap ErrHeld", mode, err)
		}
	}
	held.Close()
	again, err := TryLock(path, Exclusive)
	if err != nil {
		t.Fatalf("TryLock after the holder closed its file: %v", err)
	}
	again.Close()
}

func TestSharedLocksCoexist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	a, err := Lock(path, Shared)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := TryLock(path, Shared)
	if err != nil {
		t.Fatalf("second shared lock: %v", err)
	}
	b.Close()
	if f, err := TryLock(path, Exclusive); !errors.Is(err, ErrHeld) {
		if f != nil {
			f.Close()
		}
		t.Errorf("exclusive TryLock under a shared lock = %v, want ErrHeld", err)
	}
}

func TestLockWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	held, err := Lock(path, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		f, err := Lock(path, Shared)
		if err == nil {
			f.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Lock returned (%v) while the exclusive lock is held", err)
	case <-time.After(50 * time.Millisecond):
	}
	held.Close()
	if err := <-got; err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
}

func TestLockFailsWithoutTheDirectory(t *testing.T) {
	_, err := TryLock(filepath.Join(t.TempDir(), "missing", "lock"), Exclusive)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("TryLock in a missing directory = %v, want ErrNotExist", err)
	}
}
