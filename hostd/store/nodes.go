package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Node is a daemon that executes runs from a shared PostgreSQL database.
type Node struct {
	ID          string
	Hostname    string
	Capacity    int // runs it executes at once
	StartedAt   time.Time
	HeartbeatAt time.Time
}

// RegisterNode records a node starting (again: a node keeps its id across
// restarts of its state directory) with a first heartbeat.
func (s *Store) RegisterNode(ctx context.Context, n Node) error {
	_, err := s.write.ExecContext(ctx, `INSERT INTO nodes (id, hostname, capacity, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?4, ?4)
		ON CONFLICT (id) DO UPDATE SET hostname = ?2, capacity = ?3, started_at = ?4, heartbeat_at = ?4, stopped_at = NULL`,
		n.ID, n.Hostname, n.Capacity, millis(n.StartedAt))
	if err != nil {
		return fmt.Errorf("store: register node %s: %w", n.ID, err)
	}
	return nil
}

// Heartbeat records that the node is alive at at.
func (s *Store) Heartbeat(ctx context.Context, nodeID string, at time.Time) error {
	res, err := s.write.ExecContext(ctx, `UPDATE nodes SET heartbeat_at = ? WHERE id = ?`, millis(at), nodeID)
	if err := oneRow(res, err); err != nil {
		return fmt.Errorf("store: heartbeat of node %s: %w", nodeID, err)
	}
	return nil
}

// StopNode records a node's orderly stop.
func (s *Store) StopNode(ctx context.Context, nodeID string, at time.Time) error {
	if _, err := s.write.ExecContext(ctx, `UPDATE nodes SET stopped_at = ? WHERE id = ?`, millis(at), nodeID); err != nil {
		return fmt.Errorf("store: stop node %s: %w", nodeID, err)
	}
	return nil
}

// LostRun is a running run whose node stopped heartbeating.
type LostRun struct {
	Run
	NodeID   string
	Hostname string
}

// LostRuns lists the running runs whose node last beat before cutoff.
func (s *Store) LostRuns(ctx context.Context, cutoff time.Time) ([]LostRun, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+prefixed("runs", runColumns)+`, nodes.id, nodes.hostname
		FROM runs JOIN nodes ON nodes.id = runs.node_id
		WHERE runs.status = 'running' AND nodes.heartbeat_at < ? ORDER BY runs.seq`, millis(cutoff))
	if err != nil {
		return nil, fmt.Errorf("store: lost runs: %w", err)
	}
	defer rows.Close()
	var out []LostRun
	for rows.Next() {
		var l LostRun
		r, err := scanRun(scannerFunc(func(dest ...any) error {
			return rows.Scan(append(dest, &l.NodeID, &l.Hostname)...)
		}))
		if err != nil {
			return nil, fmt.Errorf("store: lost runs: %w", err)
		}
		l.Run = r
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: lost runs: %w", err)
	}
	return out, nil
}

// RunningOn lists the runs running on one node: what a node that restarts
// finds its earlier process left behind.
func (s *Store) RunningOn(ctx context.Context, nodeID string) ([]Run, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+runColumns+` FROM runs WHERE status = 'running' AND node_id = ? ORDER BY seq`, nodeID)
	if err != nil {
		return nil, fmt.Errorf("store: runs on node %s: %w", nodeID, err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("store: runs on node %s: %w", nodeID, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: runs on node %s: %w", nodeID, err)
	}
	return out, nil
}

// RunSpec returns the spec kept for an active run (NewRun.Spec);
// ErrNotFound once the run has finished.
func (s *Store) RunSpec(ctx context.Context, runID string) (json.RawMessage, error) {
	var spec string
	err := s.read.QueryRowContext(ctx, `SELECT spec FROM run_specs WHERE run_id = ?`, runID).Scan(&spec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: spec of %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: spec of %s: %w", runID, err)
	}
	return json.RawMessage(spec), nil
}

// RequestCancel asks the node running the run to cancel it (on
// PostgreSQL its transaction announces the request on ephemeral_cancel);
// false when the run is not running.
func (s *Store) RequestCancel(ctx context.Context, runID string, at time.Time) (bool, error) {
	res, err := s.write.ExecContext(ctx, `UPDATE runs SET cancel_requested_at = ?
		WHERE id = ? AND status = 'running' AND cancel_requested_at IS NULL`, millis(at), runID)
	if err := oneRow(res, err); errors.Is(err, ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("store: request cancel of %s: %w", runID, err)
	}
	return true, nil
}

// CancelRequested lists the node's running runs that someone asked to
// cancel: what the node checks in case it missed an announcement.
func (s *Store) CancelRequested(ctx context.Context, nodeID string) ([]string, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT id FROM runs WHERE status = 'running' AND node_id = ? AND cancel_requested_at IS NOT NULL`, nodeID)
	if err != nil {
		return nil, fmt.Errorf("store: cancel requests: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("store: cancel requests: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: cancel requests: %w", err)
	}
	return ids, nil
}

// scannerFunc adapts a function to scanner.
type scannerFunc func(dest ...any) error

func (f scannerFunc) Scan(dest ...any) error { return f(dest...) }

// prefixed qualifies each of a comma-separated column list with table.
func prefixed(table, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = table + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}
