// Package cleanup undoes a multi-step setup when a later step fails, in the
// spirit of gVisor's cleanup.Cleanup: each step that acquires something adds
// its undo to a Stack, a deferred Run undoes whatever was added, and Release
// after the last step keeps everything, optionally handing the undos to the
// new owner for its own teardown.
//
//	var undo cleanup.Stack
//	defer undo.Run()
//	f, err := open()
//	if err != nil {
//		return err
//	}
//	undo.Add(func() { f.Close() })
//	...
//	undo.Release()
package cleanup

import "errors"

// Stack holds undo steps; the zero value is an empty stack. It is not safe
// for concurrent use: it belongs to the goroutine doing the setup.
type Stack struct {
	steps []func() error
}

// Add pushes an undo step that cannot fail, or whose failure nobody could
// act on.
func (s *Stack) Add(undo func()) {
	s.steps = append(s.steps, func() error { undo(); return nil })
}

// AddErr pushes an undo step whose error Run reports.
func (s *Stack) AddErr(undo func() error) {
	s.steps = append(s.steps, undo)
}

// Run undoes every step, newest first (a step may depend on those before
// it), and empties the stack, so a second Run, or a Run after Release, does
// nothing. Every step runs even if an earlier one fails; the errors are
// joined.
func (s *Stack) Run() error {
	var errs []error
	for i := len(s.steps) - 1; i >= 0; i-- {
		errs = append(errs, s.steps[i]())
	}
	s.steps = nil
	return errors.Join(errs...)
}

// Release empties s, so that its deferred Run undoes nothing, and returns
// the steps as a new Stack for the owner of what the setup built: its Run
// is the owner's teardown. Callers with no use for them ignore the result.
func (s *Stack) Release() Stack {
	out := Stack{steps: s.steps}
	s.steps = nil
	return out
}
