package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// Recording is the run's recording of its model turns: wrap the run's
// provider with it (recording.Wrap) and join its Err into the run's error.
// Each turn is stored as it completes, where it is purged with the rest of
// the run's content, up to the configured cap; a turn that would pass the
// cap ends the recording, marked truncated, and the timeline says so.
// Under zero data retention nothing is stored.
func (r *Recorder) Recording() *recording.Writer { return r.recording }

// recordingSink stores a run's recording as its Writer produces it.
type recordingSink struct{ r *Recorder }

func (s recordingSink) AppendExchange(turn int, entry []byte) error {
	if s.r.zeroRetention {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	return s.r.svc.store.AppendRecordingExchange(ctx, s.r.runID, turn, entry)
}

func (s recordingSink) Truncated(t recording.Truncation) error {
	if s.r.zeroRetention {
		return nil
	}
	mark, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("runs: mark the recording of %s truncated: %w", s.r.runID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	if err := s.r.svc.store.SetRecordingTruncation(ctx, s.r.runID, mark); err != nil {
		return err
	}
	if t.DroppedTurns > 1 {
		return nil
	}
	return s.r.Event(timeline.Model, timeline.RecordingCapped(t.KeptTurns+1, t.LimitBytes),
		map[string]any{"recorded_turns": t.KeptTurns, "limit_bytes": t.LimitBytes})
}

// Recording returns the recording file of one of an organisation's runs,
// as `ephemeral run --replay` reads it: the turns stored so far (all of
// them once the run has ended), marked when its cap cut it. A run without
// one, and another organisation's run, are store.ErrNotFound.
func (s *Service) Recording(ctx context.Context, orgID, runID string) ([]byte, error) {
	stored, err := s.store.Recording(ctx, orgID, runID)
	if err != nil {
		return nil, err
	}
	if stored.Document != nil {
		return stored.Document, nil
	}
	var doc bytes.Buffer
	if err := recording.WriteDocument(&doc, stored.Exchanges, stored.Truncation); err != nil {
		return nil, fmt.Errorf("runs: recording of %s: %w", runID, err)
	}
	return doc.Bytes(), nil
}
