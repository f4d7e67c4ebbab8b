package agent

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
)

// RecordingPath is where a run's model exchanges are stored in dir.
func RecordingPath(dir, runID string) string {
	return filepath.Join(dir, filepath.Base(runID)+".json")
}

// RemoveRecording deletes a run's recording (when its content is purged);
// a missing one is not an error.
func RemoveRecording(dir, runID string) error {
	if err := os.Remove(RecordingPath(dir, runID)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("agent: remove recording: %w", err)
	}
	return nil
}

// saveRecording writes the exchanges atomically, readable only by the
// daemon's user: they hold prompts and command output.
func saveRecording(dir, runID string, exchanges []recording.Exchange) error {
	if len(exchanges) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("agent: save recording: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".recording-*")
	if err != nil {
		return fmt.Errorf("agent: save recording: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := recording.Encode(tmp, exchanges); err != nil {
		tmp.Close()
		return fmt.Errorf("agent: save recording: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("agent: save recording: %w", err)
	}
	if err := os.Rename(tmp.Name(), RecordingPath(dir, runID)); err != nil {
		return fmt.Errorf("agent: save recording: %w", err)
	}
	return nil
}
