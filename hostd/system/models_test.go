package system

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
)

// The start-up log says which models runs can use, and whether requests
// must name one.
func TestStartUpLogSaysWhichModelsAreUsable(t *testing.T) {
	for _, c := range []struct {
		name         string
		key          string
		defaultModel string
		want         []string
	}{
		{"no provider", "", "", []string{"WARN", "no model is usable", "openai-api-key"}},
		{"no default", "sk-test", "", []string{"models usable", "gpt-4o-mini", "no default model (default-model): requests must name a model"}},
		{"usable default", "sk-test", "gpt-4o-mini", []string{"models usable", "default=gpt-4o-mini"}},
		{"unusable default", "sk-test", "claude-haiku-4-5", []string{"WARN", "the default model is not usable", "anthropic-api-key"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			models, err := registry.New(registry.Config{OpenAI: registry.ProviderConfig{APIKey: c.key}})
			if err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer
			cfg := config.Defaults()
			cfg.DefaultModel = c.defaultModel
			s := &System{Config: cfg, Log: slog.New(slog.NewTextHandler(&log, nil)), Models: models}
			s.LogModels()
			for _, w := range c.want {
				if !strings.Contains(log.String(), w) {
					t.Errorf("the log lacks %q:\n%s", w, log.String())
				}
			}
		})
	}
}
