package system

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// cluster is this daemon's part in a shared PostgreSQL database: its node
// id (kept in the state directory, so that a restarted daemon is the same
// node and ends what its earlier process left running at once) and the
// lease the configuration sets. nil on SQLite.
func (s *System) cluster() (*runs.Cluster, error) {
	if !s.Store.Postgres() {
		return nil, nil
	}
	id, err := nodeID(s.Config.StateDir)
	if err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("system: hostname: %w", err)
	}
	return &runs.Cluster{NodeID: id, Hostname: host, Lease: s.Config.NodeLease}, nil
}

// nodeID reads the state directory's node id, making one the first time.
// The state directory is locked: no other daemon makes one meanwhile.
func nodeID(stateDir string) (string, error) {
	path := filepath.Join(stateDir, "node-id")
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if !strings.HasPrefix(id, "node_") || len(id) != len("node_")+16 {
			return "", fmt.Errorf("system: %s holds %q, not a node id: remove the file to make a new one", path, id)
		}
		return id, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("system: read node id: %w", err)
	}
	raw := make([]byte, 8)
	rand.Read(raw)
	id := "node_" + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("system: write node id: %w", err)
	}
	return id, nil
}
