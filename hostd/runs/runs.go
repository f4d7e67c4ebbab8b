// Package runs orchestrates runs: it queues them with their budget reserved,
// schedules them under a global and a per-organisation concurrency cap,
// hands each to an Executor with a Recorder that meters and records it,
// enforces the hard timeout and cancellation, settles the money when the run
// ends, and recovers runs a crashed daemon left behind.
package runs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"golang.org/x/sync/semaphore"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/metrics"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

// Spec is a validated run request: everything the run is allowed to do.
type Spec struct {
	RunID             string
	OrgID             string
	Prompt            string
	Model             string
	Shell             bool
	Web               bool
	Connections       []Connection
	Files             []File
	Timeout           time.Duration
	MaxCostMicros     int64
	ZeroDataRetention bool
	// Replay names a recording whose model turns the run replays instead
	// of calling the model; its commands still run live. Empty: a live run.
	Replay string
	// Outputs are patterns (package outputs) naming the files under the
	// scratch directory that are copied out when the run ends.
	Outputs []string
	// WebhookURL, when set, is POSTed the run object when the run ends.
	WebhookURL string
}

// NeedsEgress reports whether the run may reach anything outside its VM
// (web or connections): such a run needs the broker.
func (s Spec) NeedsEgress() bool { return s.Web || len(s.Connections) > 0 }

// Connection grants the run calls to a stored connection with these HTTP methods.
type Connection struct {
	Name    string   `json:"name"`
	Methods []string `json:"methods"`
}

// File is written into the run's scratch directory before the worker
// starts, owned by the worker.
type File struct {
	Path string
	// Content is the file's bytes, which need not be text.
	Content string
	// Mode is the file's permission bits; 0 means 0644.
	Mode uint32
}

// Result is what a finished run produced.
type Result struct {
	Output string
}

// Executor drives one run to its end inside a sandbox.
type Executor interface {
	// Execute records timeline events and metered usage through rec, must
	// stop when ctx ends (cancel, timeout, budget exhausted: rec cancels ctx
	// when a charge hits the limit) and returns the run's output or error.
	Execute(ctx context.Context, spec Spec, rec *Recorder) (Result, error)
}

// Config tunes the service.
type Config struct {
	Executor        Executor // required
	Rates           ledger.Rates
	MaxConcurrent   int           // runs executing at once across the daemon; 0: DefaultMaxConcurrent()
	MaxActivePerOrg int           // queued+running runs per organisation
	Retention       time.Duration // how long run content is kept after the run ends
	// BootTimeout bounds how long a run's microVM may take to be ready
	// (0: DefaultBootTimeout); the run's own timeout starts after it.
	BootTimeout time.Duration
	// MaxRecordingBytes caps one run's recording of its model turns
	// (0: DefaultMaxRecordingBytes); the turns after it are not recorded.
	MaxRecordingBytes int64
	// MaxTimelineBytes caps what one run's content entries (commands and
	// their output, web calls) store on its timeline (0:
	// DefaultMaxTimelineBytes); a last entry says what was left out.
	MaxTimelineBytes int64
	// MaxVolatileBytes caps the output files of zero-data-retention runs
	// held in memory at once, daemon-wide (0: DefaultMaxVolatileBytes);
	// files past it are not kept.
	MaxVolatileBytes int64
	// Reconcile is called at every start-up with the ids (maybe none) of runs a dead daemon
	// left active, after their money is settled, to remove their sandboxes.
	Reconcile func(ctx context.Context, runIDs []string) error
	// Finished is told each run that ended (also at recovery), after
	// its end is stored: the webhook deliverer wakes up for it.
	Finished func(runID string)
	// Cluster, when set, makes the service one node of several sharing a
	// PostgreSQL store (see Cluster); nil: the one daemon of its database.
	Cluster *Cluster
	Logger  *slog.Logger
}

// Defaults of the size caps in Config.
const (
	DefaultMaxRecordingBytes = 8 << 20
	DefaultMaxTimelineBytes  = 4 << 20
	DefaultMaxVolatileBytes  = 256 << 20
)

// DefaultMaxConcurrent derives the global cap from the machine: one run per
// CPU, since each microVM needs roughly a core under TCG.
func DefaultMaxConcurrent() int { return max(1, runtime.NumCPU()) }

// Causes a run's context can end with.
var (
	errTimeout  = errors.New("run timed out")
	errCanceled = errors.New("run canceled by request")
	errShutdown = errors.New("daemon shutting down")
	errBudget   = errors.New("run budget exhausted")
)

// Service owns every run's goroutine.
type Service struct {
	store *store.Store
	hub   *timeline.Hub
	cfg   Config
	slots *semaphore.Weighted
	log   *slog.Logger

	// BootDurations collects the Executor's reported microVM boot times.
	BootDurations *metrics.Histogram

	// river queues and fetches runs' jobs when the service is a node of
	// a cluster; listenPool is its LISTEN connection; lastBeat is when
	// the node's heartbeat last succeeded (UnixNano).
	river      *river.Client[*sql.Tx]
	listenPool *pgxpool.Pool
	lastBeat   atomic.Int64

	wg sync.WaitGroup
	mu sync.Mutex
	// stopping is set when Serve begins to stop: no run starts after it.
	stopping bool // guarded by mu
	active   map[string]*activeRun
	// volatile holds zero-data-retention outputs in memory only, briefly,
	// so the client can still read them; volatileBytes is what their
	// files (and those of running runs) take.
	volatile      map[string]*volatileOutput
	volatileBytes int64
}

type activeRun struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

type volatileOutput struct {
	output    *string
	files     map[string]store.Output // by path; each is returned once
	fileOrder []string
	expires   time.Time
}

// finishPatience is how long a run's end is tried to be stored before the
// node gives up on it (and leaves it to its next start's recovery).
const finishPatience = 2 * time.Minute

// volatileTTL bounds how long a zero-retention output stays readable.
const volatileTTL = time.Hour

// New creates the service. Call Recover before accepting requests.
func New(st *store.Store, hub *timeline.Hub, cfg Config) *Service {
	if cfg.Executor == nil {
		panic("runs: Config.Executor is required")
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent()
	}
	if cfg.MaxActivePerOrg <= 0 {
		cfg.MaxActivePerOrg = 10
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	if cfg.BootTimeout <= 0 {
		cfg.BootTimeout = DefaultBootTimeout
	}
	if cfg.MaxRecordingBytes <= 0 {
		cfg.MaxRecordingBytes = DefaultMaxRecordingBytes
	}
	if cfg.MaxTimelineBytes <= 0 {
		cfg.MaxTimelineBytes = DefaultMaxTimelineBytes
	}
	if cfg.MaxVolatileBytes <= 0 {
		cfg.MaxVolatileBytes = DefaultMaxVolatileBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{
		store: st, hub: hub, cfg: cfg, log: cfg.Logger,
		slots:         semaphore.NewWeighted(int64(cfg.MaxConcurrent)),
		BootDurations: metrics.NewHistogram(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30),
		active:        map[string]*activeRun{},
		volatile:      map[string]*volatileOutput{},
	}
}

// NewRunID returns "run_" and 32 random hex digits.
func NewRunID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "run_" + hex.EncodeToString(b)
}

// Submission is a validated request to start a run.
type Submission struct {
	Spec           Spec // RunID is assigned by Submit
	IdempotencyKey string
	// Canonical is the request re-encoded from its parsed form: its hash
	// decides whether an idempotent retry is "the same body", and it is
	// stored unless the run has zero data retention.
	Canonical []byte
}

// Submit queues a run with its budget reserved. A retry with a known
// Idempotency-Key returns the existing run with created false.
func (s *Service) Submit(ctx context.Context, sub Submission) (store.Run, bool, error) {
	spec := sub.Spec
	spec.RunID = NewRunID()
	hash := sha256.Sum256(append([]byte(spec.OrgID+"\x00"), sub.Canonical...))
	nr := store.NewRun{
		ID: spec.RunID, OrgID: spec.OrgID, IdempotencyKey: sub.IdempotencyKey, RequestHash: hash[:],
		Model: spec.Model, ZeroRetention: spec.ZeroDataRetention, TimeoutSeconds: int(spec.Timeout / time.Second),
		Reserve: spec.MaxCostMicros, CreatedAt: time.Now(), MaxActive: s.cfg.MaxActivePerOrg,
		Queued: store.Event{Category: timeline.Queued, Message: timeline.Reserved(spec.MaxCostMicros),
			Data: mustJSON(map[string]any{"reserved_micros": spec.MaxCostMicros})},
		WebhookURL: spec.WebhookURL,
	}
	if !spec.ZeroDataRetention {
		nr.Request = sub.Canonical
	}
	if s.river != nil {
		if err := s.enqueue(&nr, spec); err != nil {
			return store.Run{}, false, err
		}
	}
	run, created, err := s.store.CreateRun(ctx, nr)
	if err != nil || !created {
		return run, created, err
	}
	if s.river == nil {
		s.start(spec, run.CreatedAt)
	}
	return run, true, nil
}

// start launches the run's goroutine; Serve's shutdown waits for it.
func (s *Service) start(spec Spec, queuedAt time.Time) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runNow(spec, queuedAt)
	}()
}

// runNow executes the run on the calling goroutine, registered as active
// so that Cancel and Serve's shutdown reach it. It reports false, having
// done nothing, once Serve has begun to stop.
func (s *Service) runNow(spec Spec, queuedAt time.Time) bool {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ar := &activeRun{cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return false
	}
	s.active[spec.RunID] = ar
	s.mu.Unlock()
	defer close(ar.done)
	defer func() {
		s.mu.Lock()
		delete(s.active, spec.RunID)
		s.mu.Unlock()
	}()
	s.execute(ctx, spec, queuedAt)
	return true
}

// cancelLocal stops the run if it is active on this node.
func (s *Service) cancelLocal(runID string, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ar := s.active[runID]; ar != nil {
		ar.cancel(cause)
	}
}

// cancelAll stops every run active on this node.
func (s *Service) cancelAll(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ar := range s.active {
		ar.cancel(cause)
	}
}

// Cancel asks an active run to stop and waits (as long as ctx allows) until
// it has ended. Cancelling a finished run changes nothing.
func (s *Service) Cancel(ctx context.Context, orgID, runID string) (store.Run, error) {
	run, err := s.store.GetRun(ctx, orgID, runID)
	if err != nil {
		return store.Run{}, err
	}
	s.mu.Lock()
	ar := s.active[runID]
	s.mu.Unlock()
	if ar == nil {
		if s.river != nil && !run.Status.Terminal() {
			return s.cancelElsewhere(ctx, run)
		}
		return run, nil
	}
	ar.cancel(errCanceled)
	select {
	case <-ar.done:
	case <-ctx.Done():
	}
	return s.store.GetRun(context.WithoutCancel(ctx), orgID, runID)
}

// VolatileOutput returns a zero-data-retention run's output while it is
// still held in memory.
func (s *Service) VolatileOutput(runID string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volatile[runID]
	if !ok || time.Now().After(v.expires) || v.output == nil {
		return "", false
	}
	return *v.output, true
}

// VolatileFiles lists (without their data) the output files of a
// zero-data-retention run that are held in memory and not yet taken.
func (s *Service) VolatileFiles(runID string) []store.Output {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volatile[runID]
	if !ok || time.Now().After(v.expires) {
		return nil
	}
	var out []store.Output
	for _, p := range v.fileOrder {
		if f, ok := v.files[p]; ok {
			f.Data = nil
			out = append(out, f)
		}
	}
	return out
}

// TakeVolatileFile returns an output file of a zero-data-retention run and
// forgets it: such a file is returned once, never stored.
func (s *Service) TakeVolatileFile(runID, path string) (store.Output, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volatile[runID]
	if !ok || time.Now().After(v.expires) {
		return store.Output{}, false
	}
	f, ok := v.files[path]
	if ok {
		delete(v.files, path)
		s.volatileBytes -= f.Size
	}
	return f, ok
}

// holdVolatile counts n more bytes of zero-retention files against the
// daemon-wide cap; false when they do not fit.
func (s *Service) holdVolatile(n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.volatileBytes+n > s.cfg.MaxVolatileBytes {
		return false
	}
	s.volatileBytes += n
	return true
}

// dropVolatile forgets a run's held output and its files.
func (s *Service) dropVolatile(runID string) {
	if v, ok := s.volatile[runID]; ok {
		for _, f := range v.files {
			s.volatileBytes -= f.Size
		}
		delete(s.volatile, runID)
	}
}

// Serve runs the retention janitor (and, as a node of a cluster, takes
// jobs, heartbeats and watches the other nodes) until ctx ends, then stops
// every active run (they end as failed, their money settled) and waits for
// them.
func (s *Service) Serve(ctx context.Context, janitorEvery time.Duration) {
	if s.river != nil {
		var cluster sync.WaitGroup
		cluster.Go(func() {
			if err := s.serveCluster(ctx); err != nil {
				s.log.Error("serve as a node", "err", err)
			}
		})
		defer func() {
			cluster.Wait()
			s.stopCluster()
		}()
	}
	tick := time.NewTicker(janitorEvery)
	defer tick.Stop()
	for {
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("retention janitor", "err", err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			s.mu.Lock()
			s.stopping = true
			s.mu.Unlock()
			s.cancelAll(errShutdown)
			s.wg.Wait()
			return
		}
	}
}

// idempotencyWindow is how long an Idempotency-Key is remembered.
const idempotencyWindow = 24 * time.Hour

// Sweep is one round of the retention janitor, which Serve runs every
// janitor interval: it purges the content of runs whose retention ended
// and gives the space back, forgets old idempotency keys and drops expired
// zero-retention outputs from memory. It returns how many runs it purged.
// The store does the work in short transactions, paced, so requests keep
// being served meanwhile.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	now := time.Now()
	s.mu.Lock()
	for id, v := range s.volatile {
		if now.After(v.expires) {
			s.dropVolatile(id)
		}
	}
	s.mu.Unlock()
	n, err := s.store.PurgeExpired(ctx, now, idempotencyWindow)
	if err != nil {
		return n, fmt.Errorf("runs: purge expired runs: %w", err)
	}
	reclaimed, err := s.store.ReclaimSpace(ctx)
	if err != nil {
		return n, fmt.Errorf("runs: reclaim space: %w", err)
	}
	if n > 0 || reclaimed > 0 {
		// Old WAL frames still hold the purged content until a checkpoint.
		if err := s.store.Checkpoint(ctx); err != nil {
			return n, fmt.Errorf("runs: %w", err)
		}
		s.log.Info("retention janitor purged runs", "count", n, "pages_reclaimed", reclaimed)
	}
	return n, nil
}

func (s *Service) execute(ctx context.Context, spec Spec, queuedAt time.Time) {
	rec := newRecorder(s, spec, queuedAt)
	var res Result
	var execErr error
	if err := s.slots.Acquire(ctx, 1); err != nil {
		execErr = err
	} else {
		defer s.slots.Release(1)
		if ok, err := s.store.MarkRunning(context.WithoutCancel(ctx), spec.RunID, s.nodeID(), time.Now()); err != nil {
			execErr = err
		} else if ok {
			s.hub.Notify(spec.RunID)
			res, execErr = s.run(ctx, spec, rec)
		} else if s.river != nil {
			return // another node took it, or it ended: not this node's to finish
		}
	}
	s.finish(ctx, spec, rec, res, execErr)
}

// runError tags an Executor's error with why its context ended, so the
// outcome can tell a timeout from a failure.
type runError struct {
	cause error // errTimeout, errBudget, or the parent's cause
	err   error
}

func (e *runError) Error() string   { return e.err.Error() }
func (e *runError) Unwrap() []error { return []error{e.err, e.cause} }

func (s *Service) run(ctx context.Context, spec Spec, rec *Recorder) (Result, error) {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	rec.setStop(stop)
	clock := newRunClock(stop, s.cfg.BootTimeout, spec.Timeout)
	defer clock.halt()
	rec.clock = clock
	res, err := s.cfg.Executor.Execute(ctx, spec, rec)
	// Once the run's context has ended (timeout, budget, cancel), that is
	// how the run ended, even if the Executor reports success.
	cause := context.Cause(ctx)
	if cause == nil && clock.expired() {
		cause = errTimeout
	}
	if cause != nil {
		if err == nil {
			err = cause
		}
		err = &runError{cause: cause, err: err}
	}
	return res, err
}

// Failure is an Executor's error that tells the user why the run failed,
// and what to do about it, under an error code of its own (the run's
// error.code) instead of run_failed.
type Failure struct {
	// Code is the run's error code, e.g. "provider_auth_failed".
	Code string
	// Message is in the system's own words, so it is shown even under
	// zero data retention.
	Message string
	// Err is the cause; its text (which may quote a provider) is
	// withheld under zero data retention.
	Err error
}

func (f *Failure) Error() string {
	if f.Err == nil {
		return f.Message
	}
	return f.Message + " (" + f.Err.Error() + ")"
}

func (f *Failure) Unwrap() error { return f.Err }

// outcome classifies how a run ended. The budget wins over everything else
// because a run stopped at its limit must say so, whatever error the
// Executor returned while being stopped.
func (s *Service) outcome(ctx context.Context, rec *Recorder, spec Spec, execErr error) (st store.Status, code, category, message string) {
	cause := context.Cause(ctx)
	var failure *Failure
	switch {
	// An Executor may also stop before a charge hits the limit, when what
	// is left cannot pay for anything useful.
	case rec.meter.Exceeded() || errors.Is(execErr, ledger.ErrBudgetExceeded):
		return store.BudgetExceeded, "budget_exceeded", timeline.BudgetExceeded, timeline.LimitReached(spec.MaxCostMicros)
	case errors.Is(cause, errCanceled):
		return store.Canceled, "canceled", timeline.Canceled, "canceled by request"
	case errors.Is(cause, errShutdown):
		return store.Failed, "daemon_shutdown", timeline.Failed, "the daemon shut down while this run was active"
	case errors.Is(cause, errNodeLost):
		return store.Failed, "node_lost", timeline.Failed, "this run's node could not reach the database for longer than its lease; the run was ended"
	case errors.Is(execErr, errTimeout):
		return store.TimedOut, "timeout", timeline.TimedOut, timeline.TimedOutAfter(int(spec.Timeout / time.Second))
	case errors.Is(execErr, errBootTimeout):
		return store.Failed, "boot_timeout", timeline.Failed, fmt.Sprintf("the microVM was not ready within the boot limit of %d s; "+
			"the run's timeout had not started and no compute was charged", int(s.cfg.BootTimeout/time.Second))
	case errors.As(execErr, &failure):
		if spec.ZeroDataRetention {
			return store.Failed, failure.Code, timeline.Failed, failure.Message
		}
		return store.Failed, failure.Code, timeline.Failed, failure.Error()
	case execErr != nil:
		msg := execErr.Error()
		if spec.ZeroDataRetention {
			// An executor's error may quote the prompt or command output.
			msg = "the run failed (details withheld: zero data retention)"
		}
		return store.Failed, "run_failed", timeline.Failed, msg
	}
	return store.Succeeded, "", timeline.Successful, ""
}

func (s *Service) finish(ctx context.Context, spec Spec, rec *Recorder, res Result, execErr error) {
	st, code, category, message := s.outcome(ctx, rec, spec, execErr)
	usage, cost := rec.meter.Snapshot()
	if st == store.Succeeded {
		message = timeline.ModelSummary(usage.ModelCalls, usage.Tokens())
	}
	now := time.Now()
	f := store.Finish{Status: st, Usage: usage, Cost: cost, At: now, RetentionUntil: now.Add(s.cfg.Retention)}
	if code != "" {
		f.ErrorCode, f.ErrorMessage = code, message
	}
	if spec.ZeroDataRetention {
		v := &volatileOutput{files: map[string]store.Output{}, expires: now.Add(volatileTTL)}
		if st == store.Succeeded {
			v.output = &res.Output
		}
		for _, o := range rec.takeFiles() {
			v.files[o.Path] = o
			v.fileOrder = append(v.fileOrder, o.Path)
		}
		s.mu.Lock()
		s.volatile[spec.RunID] = v
		s.mu.Unlock()
	} else if st == store.Succeeded {
		f.Output = &res.Output
	}
	t := now.Sub(rec.queuedAt)
	// What the timeline cap left out is said last before the outcome.
	leftOut := rec.timeline.leftOut(t)
	// The end of a run must be stored, or its hold stays held: a database
	// that is briefly away (a failover, a lost connection) is waited for.
	// ErrNotFound: someone else ended it (another node, for node_lost).
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		_, err := s.store.FinishRun(context.WithoutCancel(ctx), spec.RunID, f, func(charged, released int64) []store.Event {
			return slices.Concat(leftOut, []store.Event{
				{T: t, Category: category, Message: message, Data: mustJSON(map[string]any{
					"status": st, "model_calls": usage.ModelCalls, "tokens": usage.Tokens()})},
				settledEvent(t, cost, charged, released),
			})
		})
		if err == nil || errors.Is(err, store.ErrNotFound) {
			break
		}
		if time.Since(now) > finishPatience {
			s.log.Error("finish run: giving up; the node's next start ends it", "run", spec.RunID, "err", err)
			break
		}
		s.log.Warn("finish run: trying again", "run", spec.RunID, "err", err, "in", wait)
		time.Sleep(wait)
	}
	s.hub.Notify(spec.RunID)
	if s.cfg.Finished != nil {
		s.cfg.Finished(spec.RunID)
	}
}

// settledEvent is a run's last timeline entry: the money.
func settledEvent(t time.Duration, cost ledger.Cost, charged, released int64) store.Event {
	return store.Event{T: t, Category: timeline.WorkerDestroyed, Message: timeline.Settled(charged, released), Data: mustJSON(map[string]any{
		"charged_micros": charged, "released_micros": released,
		"model_micros": cost.Model, "web_micros": cost.Web, "compute_micros": cost.Compute})}
}

// settledEvents are a run's last two timeline entries when it is ended
// by someone other than its executor: how it ended, and the money.
func settledEvents(t time.Duration, category, message string, st store.Status, r store.Run, charged, released int64) []store.Event {
	return []store.Event{
		{T: t, Category: category, Message: message, Data: mustJSON(map[string]any{"status": st})},
		settledEvent(t, r.Cost, charged, released),
	}
}

// Recover ends the runs a dead daemon left queued or running: each becomes
// failed with its metered cost charged and the rest of its hold released,
// and the entries of commands that were still running are closed as
// interrupted; then Config.Reconcile removes their sandboxes — and
// whatever else dead processes left, so it runs even when no run was
// active. A node of a cluster first joins it (River's schema and client,
// its node record) and ends only the runs its own earlier process left
// running: queued runs belong to the queue, and other nodes' runs to them.
func (s *Service) Recover(ctx context.Context) ([]string, error) {
	var left []store.Run
	var err error
	if s.cfg.Cluster != nil {
		if err := s.startCluster(ctx); err != nil {
			return nil, err
		}
		left, err = s.store.RunningOn(ctx, s.cfg.Cluster.NodeID)
	} else {
		left, err = s.store.ActiveRuns(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("runs: recover: %w", err)
	}
	var ids []string
	for _, r := range left {
		const msg = "the daemon stopped while this run was active (crash or kill); it was ended at restart and its metered cost charged"
		// The state directory is locked: no other daemon writes this
		// run's timeline meanwhile.
		if err := s.endLeftRun(ctx, r, "daemon_restarted", msg, store.Expect{}); err != nil {
			return ids, fmt.Errorf("runs: recover %s: %w", r.ID, err)
		}
		ids = append(ids, r.ID)
	}
	if s.cfg.Reconcile != nil {
		if err := s.cfg.Reconcile(ctx, ids); err != nil {
			return ids, fmt.Errorf("runs: reconcile sandboxes: %w", err)
		}
	}
	return ids, nil
}

// endLeftRun ends a run its executor can no longer end (its daemon died):
// failed with code and msg, its metered cost charged, the entries of
// commands still running closed as interrupted, if it is still as expect
// says (else ErrNotFound).
func (s *Service) endLeftRun(ctx context.Context, r store.Run, code, msg string, expect store.Expect) error {
	interrupted, err := s.interruptedEntries(ctx, r.ID)
	if err != nil {
		return err
	}
	now := time.Now()
	t := now.Sub(r.CreatedAt)
	f := store.Finish{Status: store.Failed, ErrorCode: code, ErrorMessage: msg,
		Usage: r.Usage, Cost: r.Cost, At: now, RetentionUntil: now.Add(s.cfg.Retention), Amend: interrupted, Expect: expect}
	_, err = s.store.FinishRun(ctx, r.ID, f, func(charged, released int64) []store.Event {
		return settledEvents(t, timeline.Failed, msg, store.Failed, r, charged, released)
	})
	if err != nil {
		return err
	}
	s.hub.Notify(r.ID)
	if s.cfg.Finished != nil {
		s.cfg.Finished(r.ID)
	}
	return nil
}

// nodeID is this node's id, or empty for the one daemon of an SQLite
// database.
func (s *Service) nodeID() string {
	if s.cfg.Cluster == nil {
		return ""
	}
	return s.cfg.Cluster.NodeID
}

// interruptedMessage is the error of a command entry closed by recovery.
const interruptedMessage = "the daemon stopped while this command ran; its result is unknown"

// interruptedEntries finds the run's timeline entries still marked
// timeline.Running and returns each one's data closed as
// timeline.Interrupted, the rest of it kept as it was.
func (s *Service) interruptedEntries(ctx context.Context, runID string) ([]store.Amendment, error) {
	var out []store.Amendment
	for after := int64(0); ; {
		list, err := s.store.Events(ctx, runID, after, followPage)
		if err != nil {
			return nil, err
		}
		for _, e := range list {
			var fields map[string]json.RawMessage
			var state timeline.State
			if json.Unmarshal(e.Data, &fields) != nil || json.Unmarshal(fields["state"], &state) != nil || state != timeline.Running {
				continue
			}
			fields["state"], _ = json.Marshal(timeline.Interrupted)
			fields["error"], _ = json.Marshal(interruptedMessage)
			data, err := json.Marshal(fields)
			if err != nil {
				return nil, fmt.Errorf("close entry %d: %w", e.Seq, err)
			}
			out = append(out, store.Amendment{Seq: e.Seq, Data: data})
		}
		if len(list) < followPage {
			return out, nil
		}
		after = list[len(list)-1].Seq
	}
}
