package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
)

// runner is what executes runs in this process: the microVM manager, the
// model registry, the broker for runs granted web or connections, and the
// agent driving them.
type runner struct {
	manager  *sandbox.Manager
	models   *registry.Registry
	executor *agent.Executor
	replayOf string
}

// runnerOptions adapt the runner to `ephemeral run --replay`.
type runnerOptions struct {
	providers map[string]model.Provider // beside the built-in ones
	models    []registry.ModelConfig    // added to the configured ones
	replayOf  string                    // the recording being replayed
	// connections loads organisations' connections with their secrets;
	// nil where no organisation has any (a run's granted connections
	// then answer 503).
	connections broker.Connections
}

// newRunner reads the model providers from the environment (see
// hostd/model/registry) plus any extra providers and models (the replay
// provider), and boots sandboxes from the state directory's image, behind
// a broker that serves the example systems from this process.
func newRunner(stateDir string, opts runnerOptions) (*runner, error) {
	cfg, err := registry.ConfigFromEnv(os.Getenv, os.ReadFile)
	if err != nil {
		return nil, err
	}
	cfg.Providers = opts.providers
	cfg.Models = append(cfg.Models, opts.models...)
	models, err := registry.New(cfg)
	if err != nil {
		return nil, err
	}
	manager, err := sandbox.NewManager(sandbox.Config{StateDir: stateDir})
	if err != nil {
		return nil, fmt.Errorf("runs need the guest image (ephemeral image build): %w", err)
	}
	b := broker.New(broker.Config{
		Connections: opts.connections,
		InProcess:   map[string]http.Handler{examplecrm.Host: examplecrm.Handler()},
	})
	executor, err := agent.New(agent.Config{Boot: agent.SandboxBoot(manager, b), Models: models, ReplayOf: opts.replayOf})
	if err != nil {
		return nil, err
	}
	return &runner{manager: manager, models: models, executor: executor, replayOf: opts.replayOf}, nil
}

// validateModel is the API's check that a run's model can be served and
// priced; its errors become 400 responses.
func (rt *runner) validateModel(name string) error {
	_, err := rt.models.Lookup(name)
	return err
}

// reconcile removes sandboxes a dead daemon left behind.
func (rt *runner) reconcile(ctx context.Context, _ []string) error {
	_, err := rt.manager.Reconcile(ctx)
	return err
}
