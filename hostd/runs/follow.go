package runs

import (
	"context"
	"fmt"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// Follower receives a run's timeline as Follow reads it.
type Follower interface {
	// Events gets entries in revision order. An entry amended later (a
	// shell command's, when the command ends) comes again with the same
	// Seq and a higher Rev; the follower replaces what it had.
	Events(batch []store.Event) error
	// Idle is called each FollowHeartbeat while nothing changes, so a
	// stream can keep its connection alive.
	Idle() error
}

// FollowHeartbeat is how often Follow calls Idle, and re-reads the
// timeline, while it waits for a change.
const FollowHeartbeat = 15 * time.Second

const followPage = 500

// Follow sends the run's timeline entries with a revision above after to f,
// live, until the run has ended and every entry is sent; it returns the
// ended run. It also returns when ctx ends or f fails. The SSE handler and
// the CLI both follow runs through it.
func (s *Service) Follow(ctx context.Context, orgID, runID string, after int64, f Follower) (store.Run, error) {
	heartbeat := time.NewTicker(FollowHeartbeat)
	defer heartbeat.Stop()
	for {
		// Take the wake-up channel before reading, so an entry appended
		// between the read and the wait still wakes us.
		changed := s.hub.Changed(runID)
		run, err := s.store.GetRun(ctx, orgID, runID)
		if err != nil {
			return store.Run{}, err
		}
		// The final entries are written in the same transaction as the
		// terminal status: reading after seeing it gets them all.
		for {
			list, err := s.store.EventsSince(ctx, runID, after, followPage)
			if err != nil {
				return run, fmt.Errorf("runs: follow %s: %w", runID, err)
			}
			if len(list) > 0 {
				if err := f.Events(list); err != nil {
					return run, err
				}
				after = list[len(list)-1].Rev
			}
			if len(list) < followPage {
				break
			}
		}
		if run.Status.Terminal() {
			return run, nil
		}
		select {
		case <-changed:
		case <-heartbeat.C:
			if err := f.Idle(); err != nil {
				return run, err
			}
		case <-ctx.Done():
			return run, context.Cause(ctx)
		}
	}
}
