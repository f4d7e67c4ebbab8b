package main

import (
	"context"
	"fmt"
	"os"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
)

// runner is what executes runs in this process: the microVM manager, the
// model registry and the agent driving both.
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
}

// newRunner reads the model providers from the environment (see
// hostd/model/registry) plus any extra providers and models (the replay
// provider), and boots sandboxes from the state directory's image.
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
	executor, err := agent.New(agent.Config{Boot: agent.SandboxBoot(manager), Models: models, ReplayOf: opts.replayOf})
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
