// Package system is Ephemeral's composition root: the one place that turns
// a config.Config into a working daemon. New builds, in order, the store,
// the secret key and connection registry, the model registry, the timeline
// hub, the sandbox manager, the broker, the agent, the runs service and the
// API server; Close tears them down in reverse. `ephemeral serve`, `run`,
// `admin`, `bench` and the end-to-end tests all get their parts here, and
// nothing else wires subsystems together.
//
// The adapters that exist only to join two packages live here too: a run's
// grants as the broker reads them, the broker's events on a run's timeline
// (RunObserver), and the agent's boot of a sealed or brokered sandbox.
package system

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"github.com/ephemeralhq/ephemeral/guest/limits"
	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/api"
	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/internal/cleanup"
)

// System is the daemon's parts, built from one Config.
type System struct {
	Config config.Config
	Log    *slog.Logger

	Store       *store.Store
	Connections *connections.Registry
	Models      *registry.Registry
	Hub         *timeline.Hub
	// Sandboxes is nil when Options.Executor replaces the agent.
	Sandboxes *sandbox.Manager
	Broker    *broker.Broker
	Agent     *agent.Executor
	Runs      *runs.Service
	API       *api.Server

	parts cleanup.Stack // the parts' teardowns, in the order they were built

	runsCancel context.CancelFunc
	runsDone   chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// Options adapt a System to the commands and tests that need something
// other than the configured daemon. The zero value is `ephemeral serve`.
type Options struct {
	Logger *slog.Logger
	// Database replaces the state directory's database file; `ephemeral
	// run` uses a throwaway one. The state directory is then not locked,
	// since the daemon serving it may be running.
	Database string
	// Replay makes the model's turns come from a recording (no provider
	// needed): its model is served by the replay at the configured price.
	Replay *recording.Replay
	// ReplayOf names the recording for the timeline.
	ReplayOf string
	// Executor replaces the agent: no VMs are booted. For tests that must
	// control the course of a run.
	Executor runs.Executor
	// Reconcile replaces the removal of dead daemons' sandboxes at
	// start-up (with Executor).
	Reconcile func(ctx context.Context, runIDs []string) error
	// SandboxDir puts the sandboxes' directories somewhere of a test's own.
	SandboxDir string
	// BrokerResolver and UnsafeBrokerTestHooks let tests reach upstreams
	// on loopback; no configuration reaches them.
	BrokerResolver        broker.Resolver
	UnsafeBrokerTestHooks *broker.TestHooks
}

// DatabasePath is where the daemon keeps its database in a state directory.
func DatabasePath(stateDir string) string { return filepath.Join(stateDir, "ephemeral.db") }

// New builds the daemon's parts. Nothing runs until Start.
func New(ctx context.Context, cfg config.Config, opts Options) (_ *System, err error) {
	s := &System{Config: cfg, Log: opts.Logger}
	if s.Log == nil {
		s.Log = slog.Default()
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	dbPath := opts.Database
	if dbPath == "" {
		dbPath = DatabasePath(cfg.StateDir)
		unlock, err := lockStateDir(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		s.onClose(func() error { unlock(); return nil })
	}
	if err := s.openStore(ctx, dbPath); err != nil {
		return nil, err
	}
	if s.Models, err = newModels(cfg, opts.Replay); err != nil {
		return nil, err
	}
	s.Hub = timeline.NewHub()

	executor, reconcile := opts.Executor, opts.Reconcile
	if executor == nil {
		if s.Sandboxes, err = NewSandboxes(cfg, opts.SandboxDir, s.Log); err != nil {
			return nil, fmt.Errorf("runs need the guest image (ephemeral image build): %w", err)
		}
		s.onClose(s.Sandboxes.Shutdown)
		s.Broker = broker.New(broker.Config{
			Resolver:        opts.BrokerResolver,
			Connections:     s.Connections,
			InProcess:       map[string]http.Handler{examplecrm.Host: examplecrm.Handler()},
			UnsafeTestHooks: opts.UnsafeBrokerTestHooks,
		})
		s.Agent, err = agent.New(agent.Config{
			Boot:           sandboxBoot(s.Sandboxes, s.Broker),
			Models:         s.Models,
			ReplayOf:       opts.ReplayOf,
			MaxTurns:       cfg.MaxModelTurns,
			CommandTimeout: cfg.CommandTimeout,
		})
		if err != nil {
			return nil, err
		}
		executor = s.Agent
		reconcile = func(ctx context.Context, _ []string) error {
			_, err := s.Sandboxes.Reconcile(ctx)
			return err
		}
	}
	s.Runs = runs.New(s.Store, s.Hub, runs.Config{
		Executor: executor,
		Rates: ledger.Rates{
			ComputeMicrosPerVMSecond: cfg.ComputeMicrosPerVMSecond,
			WebMicrosPerRequest:      cfg.WebMicrosPerRequest,
		},
		MaxConcurrent:     cfg.MaxConcurrentRuns,
		MaxActivePerOrg:   cfg.MaxActiveRunsPerOrg,
		Retention:         cfg.Retention,
		MaxRecordingBytes: cfg.MaxRecordingBytes,
		MaxTimelineBytes:  cfg.MaxTimelineBytes,
		Reconcile:         reconcile,
		Logger:            s.Log,
	})
	s.API = api.New(s.Store, s.Runs, api.Config{
		DefaultModel:  cfg.DefaultModel,
		MaxCostMicros: cfg.MaxCostMicros,
		ValidateModel: func(name string) error { _, err := s.Models.Lookup(name); return err },
		Logger:        s.Log,
	})
	return s, nil
}

// OpenStore builds only the database and the connection registry, for
// `ephemeral admin`, which may run beside a serving daemon: SQLite's WAL
// and busy timeout let both write.
func OpenStore(ctx context.Context, cfg config.Config, log *slog.Logger) (*System, error) {
	s := &System{Config: cfg, Log: log}
	if s.Log == nil {
		s.Log = slog.Default()
	}
	if err := s.openStore(ctx, DatabasePath(cfg.StateDir)); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *System) openStore(ctx context.Context, dbPath string) error {
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		return err
	}
	s.Store = st
	s.onClose(st.Close)
	key, err := seal.LoadKey(s.Config.StateDir, s.Config.SecretKey)
	if err != nil {
		return err
	}
	s.Connections = connections.NewRegistry(st, key)
	return nil
}

// NewSandboxes builds the sandbox manager alone, for commands that boot
// VMs without runs (sandbox exec, bench). dir, when set, holds the
// sandboxes' directories instead of the state directory.
func NewSandboxes(cfg config.Config, dir string, log *slog.Logger) (*sandbox.Manager, error) {
	driver, err := sandbox.Detect(cfg.VMM)
	if err != nil {
		return nil, err
	}
	return sandbox.NewManager(sandbox.Config{
		StateDir: cfg.StateDir,
		RunDir:   dir,
		Driver:   driver,
		Logf:     func(format string, args ...any) { log.Warn(fmt.Sprintf(format, args...)) },
		Limits: sandbox.Limits{
			VMMOverheadMiB: cfg.VMMMemoryOverheadMiB,
			Guest: limits.Limits{
				ScratchMiB:       cfg.GuestScratchMiB,
				TmpMiB:           cfg.GuestTmpMiB,
				OverlayMiB:       cfg.GuestOverlayMiB,
				CommandProcesses: cfg.GuestCommandProcesses,
			},
		},
	})
}

// newModels builds the model registry from the configured providers and
// prices; a replay adds its recording as the provider of its model.
func newModels(cfg config.Config, replay *recording.Replay) (*registry.Registry, error) {
	rc := registry.Config{
		OpenAI:    registry.ProviderConfig{BaseURL: cfg.OpenAIBaseURL, APIKey: cfg.OpenAIAPIKey, MaxTokensField: cfg.OpenAIMaxTokensField},
		Anthropic: registry.ProviderConfig{BaseURL: cfg.AnthropicBaseURL, APIKey: cfg.AnthropicAPIKey},
	}
	if cfg.ModelsFile != "" {
		raw, err := os.ReadFile(cfg.ModelsFile)
		if err != nil {
			return nil, fmt.Errorf("models-file: %w", err)
		}
		if rc.Models, err = registry.ParseModelsFile(raw); err != nil {
			return nil, fmt.Errorf("models-file %s: %w", cfg.ModelsFile, err)
		}
	}
	if replay != nil {
		// A replay costs what the original run cost: its model's price as
		// configured, served by the recording.
		name := replay.Model()
		price, ok := registry.ConfiguredPrice(rc.Models, name)
		if !ok {
			return nil, fmt.Errorf("model %q of the recording has no price (add it to the models-file)", name)
		}
		const replayProvider = "replay"
		rc.Providers = map[string]model.Provider{replayProvider: replay}
		rc.Models = append(rc.Models, registry.ModelConfig{Name: name, Provider: replayProvider, Price: &price})
	}
	return registry.New(rc)
}

// LogModels says at start-up which models runs can use, and warns when
// none can: every run would then be refused.
func (s *System) LogModels() {
	usable := s.Models.Names()
	if len(usable) == 0 {
		s.Log.Warn("no model is usable: configure a provider (openai-api-key or openai-base-url, anthropic-api-key or anthropic-base-url; see ephemeral serve --help)")
		return
	}
	s.Log.Info("models usable", "models", usable, "default", s.Config.DefaultModel)
	if _, err := s.Models.Lookup(s.Config.DefaultModel); err != nil {
		s.Log.Warn("the default model is not usable: requests must name a model", "default", s.Config.DefaultModel, "err", err)
	}
}

// onClose registers a part's teardown; Close runs them in reverse.
func (s *System) onClose(f func() error) { s.parts.AddErr(f) }

// Close stops the runs (each ends as failed, its money settled) and closes
// every part in the reverse order of building.
func (s *System) Close() error {
	s.closeOnce.Do(func() {
		if s.runsCancel != nil {
			s.runsCancel()
			<-s.runsDone
		}
		s.closeErr = s.parts.Run()
	})
	return s.closeErr
}
