package cleanup

import (
	"errors"
	"slices"
	"testing"
)

func TestRunUndoesNewestFirstAndOnlyOnce(t *testing.T) {
	var order []string
	var s Stack
	s.Add(func() { order = append(order, "namespace") })
	s.AddErr(func() error { order = append(order, "tap"); return errors.New("tap busy") })
	s.AddErr(func() error { order = append(order, "table"); return errors.New("table gone") })

	err := s.Run()
	if want := []string{"table", "tap", "namespace"}; !slices.Equal(order, want) {
		t.Errorf("undo order %v, want %v: every step, newest first, also after one fails", order, want)
	}
	if err == nil || err.Error() != "table gone\ntap busy" {
		t.Errorf("Run() = %v, want both failures joined", err)
	}
	if err := s.Run(); err != nil || len(order) != 3 {
		t.Errorf("second Run() = %v after %d steps, want nothing undone twice", err, len(order))
	}
}

func TestReleaseHandsTheStepsOver(t *testing.T) {
	undone := 0
	var s Stack
	s.Add(func() { undone++ })
	owned := s.Release()
	if err := s.Run(); err != nil || undone != 0 {
		t.Fatalf("Run after Release undid %d steps (%v), want none", undone, err)
	}
	if err := owned.Run(); err != nil || undone != 1 {
		t.Fatalf("the released steps' Run undid %d steps (%v), want 1", undone, err)
	}
}

func TestZeroStack(t *testing.T) {
	var s Stack
	if err := s.Run(); err != nil {
		t.Errorf("Run on an empty stack: %v", err)
	}
	released := s.Release()
	if err := released.Run(); err != nil {
		t.Errorf("Run of an empty release: %v", err)
	}
}
