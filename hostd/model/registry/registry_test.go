package registry

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

func TestLookupWithAModelsFile(t *testing.T) {
	models, err := ParseModelsFile([]byte(`{"models": [
		{"name": "llama3.1:8b", "provider": "openai", "price": {"input_micros_per_mtok": 0, "output_micros_per_mtok": 0}},
		{"name": "gpt-4o-mini", "provider": "openai", "price": {"input_micros_per_mtok": 1, "output_micros_per_mtok": 2}},
		{"name": "openai/unpriced", "provider": "openai"}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{OpenAI: ProviderConfig{BaseURL: "http://127.0.0.1:11434/v1"}, Models: models})
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

func TestParseModelsFileErrors(t *testing.T) {
	for name, content := range map[string]string{
		"unknown field": `{"models":[{"name":"m","provider":"openai","price":{"input_micros_per_million":5}}]}`,
		"not JSON":      `models: []`,
	} {
		if _, err := ParseModelsFile([]byte(content)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestPriceAndModelsIgnoreWhetherTheProviderIsConfigured(t *testing.T) {
	custom := &model.Price{InputMicrosPerMTok: 7, OutputMicrosPerMTok: 9}
	// Nothing configured: an offline install.
	r, err := New(Config{Models: []ModelConfig{{Name: "gpt-4o", Provider: "openai", Price: custom}, {Name: "unpriced", Provider: "anthropic"}}})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := r.Price("gpt-4o"); !ok || p != *custom {
		t.Errorf("override: %+v %v", p, ok)
	}
	if p, ok := r.Price("openai/gpt-6-luna"); !ok || p.InputMicrosPerMTok != 50_000 {
		t.Errorf("default: %+v %v", p, ok)
	}
	for _, name := range []string{"gpt-7-imaginary", "unpriced"} {
		if _, ok := r.Price(name); ok {
			t.Errorf("priced %s", name)
		}
	}
	models := r.Models()
	byName := map[string]Status{}
	for i, m := range models {
		byName[m.Name] = m
		if i > 0 && models[i-1].Name >= m.Name {
			t.Errorf("not sorted by name: %s before %s", models[i-1].Name, m.Name)
		}
	}
	luna := byName["openai/gpt-6-luna"]
	if luna.Provider != "openai" || luna.ProviderConfigured || luna.Usable || luna.Price == nil || luna.Price.OutputMicrosPerMTok != 400_000 {
		t.Errorf("offline product page model: %+v", luna)
	}
	if u := byName["unpriced"]; u.Price != nil || u.Usable {
		t.Errorf("unpriced model: %+v", u)
	}

	r, _ = New(Config{OpenAI: ProviderConfig{APIKey: "sk"}})
	for _, m := range r.Models() {
		if m.Name == "openai/gpt-6-luna" && (!m.ProviderConfigured || !m.Usable) {
			t.Errorf("configured: %+v", m)
		}
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
