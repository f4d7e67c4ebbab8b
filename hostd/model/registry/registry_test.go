package registry

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func files(content map[string]string) func(string) ([]byte, error) {
	return func(path string) ([]byte, error) {
		c, ok := content[path]
		if !ok {
			return nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrNotExist}
		}
		return []byte(c), nil
	}
}

func TestLookupFromEnv(t *testing.T) {
	cfg, err := ConfigFromEnv(env(map[string]string{
		EnvOpenAIBaseURL: "http://127.0.0.1:11434/v1",
		EnvModelsFile:    "/etc/ephemeral/models.json",
	}), files(map[string]string{"/etc/ephemeral/models.json": `{"models": [
		{"name": "llama3.1:8b", "provider": "openai", "price": {"input_micros_per_mtok": 0, "output_micros_per_mtok": 0}},
		{"name": "gpt-4o-mini", "provider": "openai", "price": {"input_micros_per_mtok": 1, "output_micros_per_mtok": 2}},
		{"name": "openai/unpriced", "provider": "openai"}
	]}`}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}

	local, err := r.Lookup("llama3.1:8b")
	if err != nil {
		t.Fatalf("local model: %v", err)
	}
	if local.ProviderName != ProviderOpenAI || local.Provider == nil || local.Price != (model.Price{}) || local.DefaultPrice {
		t.Errorf("local model = %+v", local)
	}
	overridden, err := r.Lookup("gpt-4o-mini")
	if err != nil {
		t.Fatal(err)
	}
	if overridden.Price.InputMicrosPerMTok != 1 || overridden.DefaultPrice {
		t.Errorf("override ignored: %+v", overridden)
	}
	if def, err := r.Lookup("gpt-4o"); err != nil || !def.DefaultPrice || def.Price.OutputMicrosPerMTok == 0 {
		t.Errorf("default model: %+v, %v", def, err)
	}

	for name, want := range map[string]error{
		"gpt-7-imaginary":  ErrUnknownModel,
		"openai/unpriced":  ErrNoPrice,
		"claude-haiku-4-5": ErrProviderNotConfigured, // no Anthropic key or URL
		"GPT-4O":           ErrUnknownModel,          // names are exact
		"":                 ErrUnknownModel,
	} {
		if _, err := r.Lookup(name); !errors.Is(err, want) {
			t.Errorf("Lookup(%q) = %v, want %v", name, err, want)
		}
	}
	names := r.Names()
	if !slices.Contains(names, "llama3.1:8b") || slices.Contains(names, "openai/unpriced") || slices.Contains(names, "claude-haiku-4-5") {
		t.Errorf("Names() = %v", names)
	}
}

func TestAnthropicNeedsKeyOrURL(t *testing.T) {
	r, err := New(Config{Anthropic: ProviderConfig{APIKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Lookup("claude-sonnet-4-5")
	if err != nil || m.ProviderName != ProviderAnthropic {
		t.Errorf("Lookup = %+v, %v", m, err)
	}
	if _, err := r.Lookup("gpt-4o"); !errors.Is(err, ErrProviderNotConfigured) {
		t.Errorf("OpenAI without key or URL: %v", err)
	}
}

type constProvider struct{ text string }

func (p constProvider) Complete(context.Context, model.Request) (model.Response, error) {
	return model.Response{Text: p.text, StopReason: model.StopEndTurn}, nil
}

func TestExtraProviders(t *testing.T) {
	price := &model.Price{InputMicrosPerMTok: 50_000, OutputMicrosPerMTok: 400_000}
	r, err := New(Config{
		Providers: map[string]model.Provider{"replay": constProvider{"recorded"}},
		Models:    []ModelConfig{{Name: "openai/gpt-6-luna", Provider: "replay", Price: price}},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Lookup("openai/gpt-6-luna")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := m.Provider.Complete(context.Background(), model.Request{})
	if err != nil || resp.Text != "recorded" {
		t.Errorf("provider answered %+v, %v", resp, err)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	bad := map[string]Config{
		"unknown provider": {Models: []ModelConfig{{Name: "m", Provider: "mistral", Price: &model.Price{}}}},
		"negative price":   {Models: []ModelConfig{{Name: "m", Provider: "openai", Price: &model.Price{OutputMicrosPerMTok: -1}}}},
		"nameless model":   {Models: []ModelConfig{{Provider: "openai", Price: &model.Price{}}}},
		"bad base URL":     {OpenAI: ProviderConfig{BaseURL: "localhost:11434"}},
		"shadowing":        {Providers: map[string]model.Provider{"openai": constProvider{}}},
	}
	for name, cfg := range bad {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestConfigFromEnvErrors(t *testing.T) {
	tests := map[string]string{
		"missing file":  "",
		"unknown field": `{"models":[{"name":"m","provider":"openai","price":{"input_micros_per_million":5}}]}`,
		"not JSON":      `models: []`,
	}
	for name, content := range tests {
		fsys := map[string]string{}
		if content != "" {
			fsys["/m.json"] = content
		}
		_, err := ConfigFromEnv(env(map[string]string{EnvModelsFile: "/m.json"}), files(fsys))
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	_, err := ConfigFromEnv(env(map[string]string{EnvModelsFile: "/nope"}), os.ReadFile)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}

func TestDefaultPricesAreSane(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range DefaultModels() {
		if seen[m.Name] {
			t.Errorf("%s listed twice", m.Name)
		}
		seen[m.Name] = true
		p := m.Price
		if p == nil || p.Validate() != nil || p.InputMicrosPerMTok == 0 || p.OutputMicrosPerMTok < p.InputMicrosPerMTok ||
			p.CachedInputMicrosPerMTok > p.InputMicrosPerMTok {
			t.Errorf("%s: implausible price %+v", m.Name, p)
		}
	}
}
