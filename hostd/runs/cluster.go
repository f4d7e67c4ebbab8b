package runs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// Cluster makes the service one node of several that share a PostgreSQL
// store. Runs are then queued as River jobs, enqueued in the transaction
// that creates the run and reserves its budget; each node works up to
// Config.MaxConcurrent of them at once. A node heartbeats; when one stops
// for longer than Lease, any other ends its running runs as node_lost,
// charging what was metered. Live streams and cancels reach every node
// through the database's LISTEN/NOTIFY.
type Cluster struct {
	// NodeID names this node; it must stay the same across restarts of
	// one state directory (so a restarted node ends its own leftovers at
	// once) and differ between nodes.
	NodeID   string
	Hostname string
	Lease    time.Duration
}

// errNodeLost ends the runs of a node that could not heartbeat for a
// whole lease: other nodes have ended them already.
var errNodeLost = errors.New("this node lost its lease")

// runJob is a run's River job: only its id, the spec is in the store.
type runJob struct {
	RunID string `json:"run_id"`
}

func (runJob) Kind() string { return "run" }

// runWorker executes run jobs on this node.
type runWorker struct {
	river.WorkerDefaults[runJob]
	s *Service
}

func (w *runWorker) Work(ctx context.Context, job *river.Job[runJob]) error {
	return w.s.work(ctx, job.Args.RunID)
}

// fileJSON carries a file's bytes as base64: they need not be text.
type fileJSON struct {
	Path    string
	Content []byte
	Mode    uint32
}

// specJSON is how a spec waits in the store for the node that takes it.
type specJSON struct {
	Spec
	Files []fileJSON
}

func encodeSpec(spec Spec) (json.RawMessage, error) {
	sj := specJSON{Spec: spec}
	sj.Spec.Files = nil
	for _, f := range spec.Files {
		sj.Files = append(sj.Files, fileJSON{Path: f.Path, Content: []byte(f.Content), Mode: f.Mode})
	}
	return json.Marshal(sj)
}

func decodeSpec(raw json.RawMessage) (Spec, error) {
	var sj specJSON
	if err := json.Unmarshal(raw, &sj); err != nil {
		return Spec{}, err
	}
	spec := sj.Spec
	spec.Files = nil
	for _, f := range sj.Files {
		spec.Files = append(spec.Files, File{Path: f.Path, Content: string(f.Content), Mode: f.Mode})
	}
	return spec, nil
}

// startCluster creates River's tables (one node at a time), the River
// client and registers the node. Recover calls it.
func (s *Service) startCluster(ctx context.Context) (err error) {
	if !s.store.Postgres() {
		return errors.New("runs: several nodes need a shared PostgreSQL database")
	}
	pool, err := pgxpool.New(ctx, s.store.URL())
	if err != nil {
		return fmt.Errorf("runs: connect River's listener: %w", err)
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()
	s.listenPool = pool
	// River inserts and works jobs through the store's pool, in its
	// transactions; the pgx pool only LISTENs, so that a job inserted on
	// one node is fetched at once by another.
	driver := riverdatabasesql.NewWithPgxListener(s.store.DB(), pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return fmt.Errorf("runs: River migrator: %w", err)
	}
	if err := s.store.SchemaLocked(ctx, func() error {
		_, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		return err
	}); err != nil {
		return fmt.Errorf("runs: River's schema: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &runWorker{s: s})
	s.river, err = river.NewClient(driver, &river.Config{
		ID:      s.cfg.Cluster.NodeID,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: s.cfg.MaxConcurrent}},
		Workers: workers,
		// A run keeps its own time (boot limit, timeout); River must
		// not cancel it.
		JobTimeout: -1,
		// Jobs arrive by NOTIFY; the poll is the fallback.
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: time.Second,
		// A node killed between fetching a job and taking its run leaves
		// the job running: River's rescuer makes it available again after
		// this long. Rescuing the job of a run that is in fact running,
		// or was ended as node_lost, is harmless: work finds the run
		// taken and does nothing.
		RescueStuckJobsAfter: time.Minute,
		Logger:               s.log,
	})
	if err != nil {
		return fmt.Errorf("runs: River client: %w", err)
	}
	now := time.Now()
	if err := s.store.RegisterNode(ctx, store.Node{ID: s.cfg.Cluster.NodeID, Hostname: s.cfg.Cluster.Hostname,
		Capacity: s.cfg.MaxConcurrent, StartedAt: now, HeartbeatAt: now}); err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	s.lastBeat.Store(now.UnixNano())
	return nil
}

// enqueue fills in what a node needs to take the run: its spec and its job.
func (s *Service) enqueue(nr *store.NewRun, spec Spec) error {
	raw, err := encodeSpec(spec)
	if err != nil {
		return fmt.Errorf("runs: encode spec: %w", err)
	}
	nr.Spec = raw
	nr.Enqueue = func(ctx context.Context, tx *sql.Tx) error {
		_, err := s.river.InsertTx(ctx, tx, runJob{RunID: spec.RunID}, nil)
		return err
	}
	return nil
}

// work executes a run whose job this node fetched. A job delivered again
// (River retried it, or rescued it from a dead node) finds the run taken
// or ended and does nothing: MarkRunning lets one node have it.
func (s *Service) work(ctx context.Context, runID string) error {
	raw, err := s.store.RunSpec(ctx, runID)
	if errors.Is(err, store.ErrNotFound) {
		return nil // ended before any node took it (canceled while queued)
	}
	if err != nil {
		return err
	}
	spec, err := decodeSpec(raw)
	if err != nil {
		return fmt.Errorf("runs: decode spec of %s: %w", runID, err)
	}
	run, err := s.store.GetRun(ctx, spec.OrgID, runID)
	if err != nil {
		return err
	}
	if run.Status != store.Queued {
		return nil
	}
	// A node shutting down leaves the run queued: River delivers the
	// job again, to whichever node fetches it.
	if !s.runNow(spec, run.CreatedAt) {
		return errShutdown
	}
	return nil
}

// serveCluster heartbeats, ends the runs of nodes whose lease ran out and
// listens for timeline changes and cancels from other nodes, until ctx
// ends. Serve calls it.
func (s *Service) serveCluster(ctx context.Context) error {
	if err := s.river.Start(ctx); err != nil {
		return fmt.Errorf("runs: start River: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		s.store.Listen(ctx, []string{store.TimelineChannel, store.CancelChannel}, func(channel, runID string) {
			switch channel {
			case "":
				s.hub.NotifyAll()
				s.cancelRequested(ctx)
			case store.TimelineChannel:
				s.hub.Notify(runID)
			case store.CancelChannel:
				s.cancelLocal(runID, errCanceled)
			}
		}, func(err error) { s.log.Warn("listen for other nodes' changes", "err", err) })
	})
	wg.Go(func() { s.heartbeat(ctx) })
	wg.Go(func() { s.sweepLostNodes(ctx) })
	wg.Wait()
	return nil
}

// stopCluster stops fetching jobs, waits for the runs being worked (Serve
// has asked them to stop) and records the node's stop.
func (s *Service) stopCluster() {
	ctx := context.Background()
	if err := s.river.Stop(ctx); err != nil {
		s.log.Error("stop River", "err", err)
	}
	if err := s.store.StopNode(ctx, s.cfg.Cluster.NodeID, time.Now()); err != nil {
		s.log.Error("record node stop", "err", err)
	}
	s.listenPool.Close()
}

// heartbeat records the node alive every quarter lease. A node that could
// not for a whole lease has been given up by the others, which ended its
// runs: it stops them too, rather than let them run on unaccounted.
func (s *Service) heartbeat(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Cluster.Lease / 4)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		now := time.Now()
		if err := s.store.Heartbeat(ctx, s.cfg.Cluster.NodeID, now); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("heartbeat", "err", err)
			if now.Sub(time.Unix(0, s.lastBeat.Load())) > s.cfg.Cluster.Lease {
				s.cancelAll(errNodeLost)
			}
			continue
		}
		s.lastBeat.Store(now.UnixNano())
		s.cancelRequested(ctx)
	}
}

// cancelRequested cancels the runs of this node someone asked to cancel,
// in case the announcement was missed.
func (s *Service) cancelRequested(ctx context.Context) {
	ids, err := s.store.CancelRequested(ctx, s.cfg.Cluster.NodeID)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("look for cancel requests", "err", err)
		}
		return
	}
	for _, id := range ids {
		s.cancelLocal(id, errCanceled)
	}
}

// sweepLostNodes ends, ten times a lease, the runs of nodes whose last
// heartbeat is older than the lease. Every node sweeps; FinishRun's check
// lets one of them end each run.
func (s *Service) sweepLostNodes(ctx context.Context) {
	tick := time.NewTicker(max(s.cfg.Cluster.Lease/10, 50*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		cutoff := time.Now().Add(-s.cfg.Cluster.Lease)
		lost, err := s.store.LostRuns(ctx, cutoff)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("look for runs of lost nodes", "err", err)
			}
			continue
		}
		for _, l := range lost {
			msg := fmt.Sprintf("node %s (%s) stopped heartbeating while this run was active; after its lease of %s "+
				"node %s ended the run and charged its metered cost", l.NodeID, l.Hostname, s.cfg.Cluster.Lease, s.cfg.Cluster.Hostname)
			err := s.endLeftRun(ctx, l.Run, "node_lost", msg, store.Expect{Status: store.Running, HeartbeatBefore: cutoff})
			switch {
			case errors.Is(err, store.ErrNotFound):
				// Another node ended it first, or its node came back.
			case err != nil:
				s.log.Error("end run of a lost node", "run", l.ID, "node", l.NodeID, "err", err)
			default:
				s.log.Warn("ended run of a lost node", "run", l.ID, "node", l.NodeID)
			}
		}
	}
}

// cancelElsewhere cancels a run that is not active on this node: a queued
// one is ended here, a running one is asked of its node, and either way
// the call waits (as long as ctx allows) for the run to end.
func (s *Service) cancelElsewhere(ctx context.Context, run store.Run) (store.Run, error) {
	if run.Status == store.Queued {
		const msg = "canceled by request"
		t := time.Since(run.CreatedAt)
		now := time.Now()
		ended, err := s.store.FinishRun(ctx, run.ID, store.Finish{Status: store.Canceled, ErrorCode: "canceled", ErrorMessage: msg,
			At: now, RetentionUntil: now.Add(s.cfg.Retention), Expect: store.Expect{Status: store.Queued}},
			func(charged, released int64) []store.Event {
				return settledEvents(t, timeline.Canceled, msg, store.Canceled, run, charged, released)
			})
		if err == nil {
			s.hub.Notify(run.ID)
			if s.cfg.Finished != nil {
				s.cfg.Finished(run.ID)
			}
			return ended, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return run, err
		}
		// A node took it meanwhile: ask that node.
	}
	if _, err := s.store.RequestCancel(ctx, run.ID, time.Now()); err != nil {
		return run, err
	}
	for {
		changed := s.hub.Changed(run.ID)
		r, err := s.store.GetRun(ctx, run.OrgID, run.ID)
		if err != nil || r.Status.Terminal() {
			return r, err
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return s.store.GetRun(context.WithoutCancel(ctx), run.OrgID, run.ID)
		}
	}
}
