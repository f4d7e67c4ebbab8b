// Package system is Ephemeral's composition root: the one place that turns
// a config.Config into a working daemon. New builds, in order, the store,
// the secret key, connection registry and webhook secrets, the model
// registry, the timeline hub, the sandbox manager, the broker, the agent,
// the webhook deliverer, the runs service and the API server; Close tears
// them down in reverse. `ephemeral serve`, `run`,
// `admin`, `bench` and the end-to-end tests all get their parts here, and
// nothing else wires subsystems together.
//
// The adapters that exist only to join two packages live here too: a run's
// grants as the broker reads them, the broker's events on a run's timeline
// (RunObserver), and the agent's boot of a sealed or brokered sandbox.
package system

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"github.com/ephemeralhq/ephemeral/examples"
	"github.com/ephemeralhq/ephemeral/guest/limits"
	"github.com/ephemeralhq/ephemeral/hostd/accounts"
	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/api"
	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/forwarded"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/hostd/web"
	"github.com/ephemeralhq/ephemeral/hostd/webhook"
	"github.com/ephemeralhq/ephemeral/internal/cleanup"
)

// System is the daemon's parts, built from one Config.
type System struct {
	Config config.Config
	Log    *slog.Logger

	Store       *store.Store
	Connections *connections.Registry
	// WebhookSecrets signs webhook deliveries; Webhooks delivers them.
	WebhookSecrets *webhook.Secrets
	Webhooks       *webhook.Deliverer
	Models         *registry.Registry
	// Examples are the shipped examples, which runs may replay.
	Examples *example.Set
	Hub      *timeline.Hub
	// proxies are the trusted load balancers in front of the daemon.
	proxies forwarded.Proxies
	// Sandboxes is nil when Options.Executor replaces the agent; so is
	// Pool, which keeps sandboxes ready for runs (config PoolSize).
	Sandboxes *sandbox.Manager
	Pool      *sandbox.Pool
	Broker    *broker.Broker
	Agent     *agent.Executor
	Runs      *runs.Service
	Accounts  *accounts.Service
	API       *api.Server
	Web       *web.Server

	// Announce, when set, gets the line telling a person which URL to
	// open once Serve listens.
	Announce io.Writer

	parts cleanup.Stack // the parts' teardowns, in the order they were built

	// stopBackground ends what Start started (the runs service and the
	// webhook deliverer); background waits for them.
	stopBackground context.CancelFunc
	background     sync.WaitGroup

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
	// Replay is a recording runs may replay (ephemeral run --replay)
	// under the name ReplayOf, besides the shipped examples: a run with
	// Spec.Replay == ReplayOf gets its model's turns from it, at the
	// model's configured price, with no provider needed.
	Replay   *recording.Replay
	ReplayOf string
	// Executor replaces the agent: no VMs are booted. For tests that must
	// control the course of a run.
	Executor runs.Executor
	// Reconcile replaces the removal of dead daemons' sandboxes at
	// start-up (with Executor).
	Reconcile func(ctx context.Context, runIDs []string) error
	// SandboxDir puts the sandboxes' directories somewhere of a test's own.
	SandboxDir string
	// SingleRun is for a process that executes one run and exits
	// (`ephemeral run`): it keeps no pool and boots its sandbox, where
	// pooled sandboxes and a template would be started for nothing.
	SingleRun bool
	// BrokerResolver and UnsafeBrokerTestHooks let tests reach upstreams
	// on loopback; no configuration reaches them.
	BrokerResolver        broker.Resolver
	UnsafeBrokerTestHooks *broker.TestHooks
	// WebhookResolver and UnsafeWebhookTestHooks let tests reach a
	// webhook receiver on loopback; no configuration reaches them.
	WebhookResolver        webhook.Resolver
	UnsafeWebhookTestHooks *webhook.TestHooks
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
	if err := privateStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	// A database of the caller's own (a single run's, a test's) is an
	// SQLite file, whatever database the configuration shares.
	dbPath, shared := opts.Database, cfg.Database
	if dbPath != "" {
		shared = ""
	}
	if dbPath == "" {
		dbPath = DatabasePath(cfg.StateDir)
		unlock, err := lockStateDir(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		s.onClose(func() error { unlock(); return nil })
	}
	if err := s.openStore(ctx, dbPath, shared); err != nil {
		return nil, err
	}
	if s.proxies, err = forwarded.ParseProxies(cfg.TrustedProxies); err != nil {
		return nil, fmt.Errorf("system: trusted-proxies: %w", err)
	}
	if s.Models, err = newModels(cfg); err != nil {
		return nil, err
	}
	if s.Examples, err = example.Load(examples.Files); err != nil {
		return nil, err
	}
	s.Hub = timeline.NewHub()

	rates := ledger.Rates{ComputeMicrosPerVMSecond: cfg.ComputeMicrosPerVMSecond, WebMicrosPerRequest: cfg.WebMicrosPerRequest}
	executor, reconcile := opts.Executor, opts.Reconcile
	if executor == nil {
		if s.Sandboxes, err = newSandboxes(cfg, opts.SandboxDir, s.Log, opts.SingleRun); err != nil {
			return nil, fmt.Errorf("runs need the guest image (ephemeral image build): %w", err)
		}
		s.onClose(s.Sandboxes.Shutdown)
		// Pooled sandboxes count toward the runs' concurrency: the pool
		// is spare capacity, never more VMs than runs may have.
		poolSize := cfg.PoolSize
		if opts.SingleRun {
			poolSize = 0
		}
		s.Pool, err = s.Sandboxes.NewPool(sandbox.PoolConfig{Size: poolSize, Capacity: cfg.MaxConcurrentRuns})
		if err != nil {
			return nil, err
		}
		s.onClose(s.Pool.Close)
		s.Broker = broker.New(broker.Config{
			Resolver:        opts.BrokerResolver,
			Connections:     s.Connections,
			InProcess:       map[string]http.Handler{examplecrm.Host: examplecrm.Handler()},
			UnsafeTestHooks: opts.UnsafeBrokerTestHooks,
		})
		s.Agent, err = agent.New(agent.Config{
			Boot:               sandboxBoot(s.Pool, s.Broker),
			Models:             s.Models,
			Replays:            s.replays(opts.Replay, opts.ReplayOf),
			MaxTurns:           cfg.MaxModelTurns,
			CommandTimeout:     cfg.CommandTimeout,
			MaxOutputFileBytes: cfg.MaxOutputFileBytes,
			MaxOutputBytes:     cfg.MaxOutputBytes,
			Rates:              rates,
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
	s.Webhooks = webhook.New(webhook.Config{
		Store:   s.Store,
		Secrets: s.WebhookSecrets,
		// A delivery carries the run object as the API shows it.
		Render: func(ctx context.Context, orgID, runID string) ([]byte, error) {
			return s.API.RunObject(ctx, orgID, runID)
		},
		Attempts:        cfg.WebhookAttempts,
		FirstRetry:      cfg.WebhookFirstRetry,
		Timeout:         cfg.WebhookTimeout,
		Resolver:        opts.WebhookResolver,
		UnsafeTestHooks: opts.UnsafeWebhookTestHooks,
		Logger:          s.Log,
	})
	cluster, err := s.cluster()
	if err != nil {
		return nil, err
	}
	s.Runs = runs.New(s.Store, s.Hub, runs.Config{
		Executor:          executor,
		Rates:             rates,
		MaxConcurrent:     cfg.MaxConcurrentRuns,
		MaxActivePerOrg:   cfg.MaxActiveRunsPerOrg,
		Retention:         cfg.Retention,
		BootTimeout:       cfg.BootTimeout,
		MaxRecordingBytes: cfg.MaxRecordingBytes,
		MaxTimelineBytes:  cfg.MaxTimelineBytes,
		Reconcile:         reconcile,
		Finished:          func(string) { s.Webhooks.Wake() },
		Cluster:           cluster,
		Logger:            s.Log,
	})
	s.Accounts = accounts.New(s.Store, accounts.Config{
		StarterCreditMicros: cfg.StarterCreditMicros,
		IdleTimeout:         cfg.SessionIdleTimeout,
		MaxAge:              cfg.SessionMaxAge,
		Provision:           s.ProvisionOrg,
		Logger:              s.Log,
	})
	var minimumBudget func(runs.Spec) (int64, error)
	if s.Agent != nil {
		minimumBudget = s.Agent.MinimumBudget
	}
	s.API = api.New(s.Store, s.Runs, api.Config{
		DefaultModel:  cfg.DefaultModel,
		MaxCostMicros: cfg.MaxCostMicros,
		ValidateModel: func(name string) error { _, err := s.Models.Lookup(name); return err },
		MinimumBudget: minimumBudget,
		Limits:        apiLimits(cfg),
		Webhooks:      s.WebhookSecrets,
		Logger:        s.Log,
		Models:        s.Models.Models,
		ExampleRequest: func(name string) (json.RawMessage, string, bool) {
			ex, ok := s.Examples.Get(name)
			return ex.Request, ex.Model(), ok
		},
		Sessions: s.Accounts,
	})
	s.Web, err = web.New(web.Config{
		Store:               s.Store,
		Accounts:            s.Accounts,
		Examples:            s.Examples,
		Models:              s.Models.Models,
		DefaultModel:        cfg.DefaultModel,
		Retention:           cfg.Retention,
		StarterCreditMicros: cfg.StarterCreditMicros,
		Logger:              s.Log,
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// ProvisionOrg gives a new organisation what every organisation starts
// with: the example connections (the read-only example CRM), so the
// examples that use them run at once. One it has already is left alone.
func (s *System) ProvisionOrg(ctx context.Context, orgID string) error {
	err := s.Connections.Add(ctx, orgID, examplecrm.Connection())
	if errors.Is(err, store.ErrConnectionExists) {
		return nil
	}
	return err
}

// apiLimits are the configured limits, each rate bursting to twice itself.
func apiLimits(cfg config.Config) api.Limits {
	rate := func(perSecond int) api.Rate { return api.Rate{PerSecond: float64(perSecond), Burst: 2 * perSecond} }
	return api.Limits{
		KeyRunCreations:     rate(cfg.LimitKeyRunCreations),
		KeyReads:            rate(cfg.LimitKeyReads),
		KeyStreams:          cfg.LimitKeyStreams,
		AddressRunCreations: rate(cfg.LimitAddressRunCreations),
		AddressReads:        rate(cfg.LimitAddressReads),
		AddressStreams:      cfg.LimitAddressStreams,
	}
}

// OpenStore builds only the database and the connection registry, for
// `ephemeral admin`, which may run beside a serving daemon: SQLite's WAL
// and busy timeout let both write.
func OpenStore(ctx context.Context, cfg config.Config, log *slog.Logger) (*System, error) {
	s := &System{Config: cfg, Log: log}
	if s.Log == nil {
		s.Log = slog.Default()
	}
	if err := privateStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	if err := s.openStore(ctx, DatabasePath(cfg.StateDir), cfg.Database); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// openStore opens the shared PostgreSQL database at shared, or else the
// SQLite database at dbPath.
func (s *System) openStore(ctx context.Context, dbPath, shared string) error {
	var (
		st  *store.Store
		err error
	)
	if shared != "" {
		st, err = store.OpenPostgres(ctx, shared)
	} else {
		st, err = store.Open(ctx, dbPath)
	}
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
	s.WebhookSecrets = webhook.NewSecrets(st, key)
	return nil
}

// NewSandboxes builds the sandbox manager alone, for commands that boot
// VMs without runs (sandbox exec, bench). dir, when set, holds the
// sandboxes' directories instead of the state directory. Their sandboxes
// boot unless asked to restore (sandbox.Options.Start): a template is worth
// its boot only to a process that starts many.
func NewSandboxes(cfg config.Config, dir string, log *slog.Logger) (*sandbox.Manager, error) {
	return newSandboxes(cfg, dir, log, true)
}

func newSandboxes(cfg config.Config, dir string, log *slog.Logger, coldStarts bool) (*sandbox.Manager, error) {
	driver, err := sandbox.Detect(cfg.VMM)
	if err != nil {
		return nil, err
	}
	return sandbox.NewManager(sandbox.Config{
		StateDir:   cfg.StateDir,
		RunDir:     dir,
		Driver:     driver,
		Logf:       func(format string, args ...any) { log.Warn(fmt.Sprintf(format, args...)) },
		ColdStarts: coldStarts,
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
// prices.
func newModels(cfg config.Config) (*registry.Registry, error) {
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
	return registry.New(rc)
}

// replays serves replay runs: the recording given as own (under the name
// ownName) and the shipped examples by name. Each run gets a fresh replay
// of the recording as its model's provider, at the model's configured
// price: a replay costs what the recorded run's model calls cost.
func (s *System) replays(own *recording.Replay, ownName string) func(name string) (registry.Model, error) {
	return func(name string) (registry.Model, error) {
		var replay *recording.Replay
		if own != nil && name == ownName {
			replay = own
		} else if ex, ok := s.Examples.Get(name); ok {
			var err error
			if replay, err = ex.NewReplay(); err != nil {
				return registry.Model{}, err
			}
		} else {
			return registry.Model{}, fmt.Errorf("no recording %q", name)
		}
		price, ok := s.Models.Price(replay.Model())
		if !ok {
			return registry.Model{}, fmt.Errorf("model %q of the recording has no price (add it to the models-file)", replay.Model())
		}
		return registry.Model{Name: replay.Model(), ProviderName: "replay", Provider: replay, Price: price}, nil
	}
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
	if s.Config.DefaultModel == "" {
		s.Log.Info("no default model (default-model): requests must name a model")
	} else if _, err := s.Models.Lookup(s.Config.DefaultModel); err != nil {
		s.Log.Warn("the default model is not usable: requests must name a model", "default", s.Config.DefaultModel, "err", err)
	}
}

// onClose registers a part's teardown; Close runs them in reverse.
func (s *System) onClose(f func() error) { s.parts.AddErr(f) }

// Close stops the runs (each ends as failed, its money settled) and closes
// every part in the reverse order of building.
func (s *System) Close() error {
	s.closeOnce.Do(func() {
		if s.stopBackground != nil {
			s.stopBackground()
			s.background.Wait()
		}
		s.closeErr = s.parts.Run()
	})
	return s.closeErr
}
