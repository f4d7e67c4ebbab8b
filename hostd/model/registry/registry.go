// Package registry maps the model a run asks for to the provider that serves
// it and the price it is billed at. A run may only start with a model this
// registry knows and can price: Lookup's sentinel errors are what the API
// turns into 400 responses.
//
// Providers and prices come from configuration (package config); a few
// well-known models have default prices that configuration can override.
package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/anthropic"
	"github.com/ephemeralhq/ephemeral/hostd/model/httpcall"
	"github.com/ephemeralhq/ephemeral/hostd/model/openai"
)

// Lookup failures. Each means the request named a model this daemon cannot
// serve: a client error, not a server fault.
var (
	ErrUnknownModel          = errors.New("unknown model")
	ErrNoPrice               = errors.New("model has no price")
	ErrProviderNotConfigured = errors.New("model provider not configured")
)

// Names of the built-in providers.
const (
	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
)

// Settings names the configuration settings (package config) that hold a
// built-in provider's API key and base URL, for messages that tell an
// operator what to fix; empty for any other provider.
func Settings(provider string) (apiKey, baseURL string) {
	switch provider {
	case ProviderOpenAI, ProviderAnthropic:
		return provider + "-api-key", provider + "-base-url"
	}
	return "", ""
}

// ModelConfig declares one model.
type ModelConfig struct {
	// Name is what requests put in "model" and what is sent to the
	// provider, e.g. "gpt-4o-mini", "openai/gpt-4o-mini" (OpenRouter) or
	// "llama3.1:8b" (Ollama).
	Name string `json:"name"`
	// Provider is "openai" (any Chat Completions server), "anthropic", or
	// a name from Config.Providers.
	Provider string `json:"provider"`
	// Price is required for the model to be usable; a local model that
	// costs nothing is declared with an explicit zero price.
	Price *model.Price `json:"price,omitempty"`
}

// ProviderConfig says how to reach one provider API.
type ProviderConfig struct {
	BaseURL string
	APIKey  string
	// MaxTokensField selects max_tokens or max_completion_tokens (OpenAI
	// only; empty chooses by base URL).
	MaxTokensField string
}

// configured reports whether the operator set the provider up: a key for a
// hosted API, or a base URL for a local server that needs none.
func (p ProviderConfig) configured() bool { return p.APIKey != "" || p.BaseURL != "" }

// Config is everything the registry is built from.
type Config struct {
	OpenAI    ProviderConfig
	Anthropic ProviderConfig
	// Providers are further providers by name (the replay provider).
	Providers map[string]model.Provider
	// Models add to DefaultModels; an entry with a default's name
	// replaces it.
	Models []ModelConfig
	// HTTP tunes retries and the response cap of the built-in clients.
	HTTP httpcall.Client
}

// Model is a resolved model: who serves it and what it costs.
type Model struct {
	Name         string
	ProviderName string
	Provider     model.Provider
	Price        model.Price
	// DefaultPrice is true when the price is a built-in default that
	// configuration did not override.
	DefaultPrice bool
}

type entry struct {
	cfg          ModelConfig
	defaultPrice bool
}

// Registry resolves model names. It is read-only after New and safe for
// concurrent use.
type Registry struct {
	models    map[string]entry
	providers map[string]model.Provider
	// unconfigured names built-in providers that lack a key or base URL.
	unconfigured map[string]bool
}

// New builds the providers cfg configures and the model table.
func New(cfg Config) (*Registry, error) {
	r := &Registry{
		models:       map[string]entry{},
		providers:    map[string]model.Provider{},
		unconfigured: map[string]bool{},
	}
	for name, p := range cfg.Providers {
		if name == ProviderOpenAI || name == ProviderAnthropic {
			return nil, fmt.Errorf("registry: provider name %q is built in", name)
		}
		r.providers[name] = p
	}
	if cfg.OpenAI.configured() {
		c, err := openai.New(openai.Config{
			BaseURL: cfg.OpenAI.BaseURL, APIKey: cfg.OpenAI.APIKey,
			MaxTokensField: cfg.OpenAI.MaxTokensField, HTTP: cfg.HTTP,
		})
		if err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
		r.providers[ProviderOpenAI] = c
	} else {
		r.unconfigured[ProviderOpenAI] = true
	}
	if cfg.Anthropic.configured() {
		c, err := anthropic.New(anthropic.Config{BaseURL: cfg.Anthropic.BaseURL, APIKey: cfg.Anthropic.APIKey, HTTP: cfg.HTTP})
		if err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
		r.providers[ProviderAnthropic] = c
	} else {
		r.unconfigured[ProviderAnthropic] = true
	}

	for _, m := range DefaultModels() {
		r.models[m.Name] = entry{cfg: m, defaultPrice: true}
	}
	for _, m := range cfg.Models {
		if err := r.checkModel(m); err != nil {
			return nil, err
		}
		r.models[m.Name] = entry{cfg: m}
	}
	return r, nil
}

func (r *Registry) checkModel(m ModelConfig) error {
	if m.Name == "" {
		return fmt.Errorf("registry: model without a name")
	}
	if _, ok := r.providers[m.Provider]; !ok && !r.unconfigured[m.Provider] {
		return fmt.Errorf("registry: model %q: unknown provider %q", m.Name, m.Provider)
	}
	if m.Price != nil {
		if err := m.Price.Validate(); err != nil {
			return fmt.Errorf("registry: model %q: %w", m.Name, err)
		}
	}
	return nil
}

// Lookup resolves a request's model name. Its errors wrap ErrUnknownModel,
// ErrNoPrice or ErrProviderNotConfigured.
func (r *Registry) Lookup(name string) (Model, error) {
	e, ok := r.models[name]
	if !ok {
		return Model{}, fmt.Errorf("model %q: %w", name, ErrUnknownModel)
	}
	if e.cfg.Price == nil {
		return Model{}, fmt.Errorf("model %q: %w", name, ErrNoPrice)
	}
	p, ok := r.providers[e.cfg.Provider]
	if !ok {
		how := "its API key or base URL"
		if key, url := Settings(e.cfg.Provider); key != "" {
			how = "the " + key + " or " + url + " setting"
		}
		return Model{}, fmt.Errorf("model %q needs provider %q, which this daemon has not configured (%s): %w",
			name, e.cfg.Provider, how, ErrProviderNotConfigured)
	}
	return Model{
		Name: name, ProviderName: e.cfg.Provider, Provider: p,
		Price: *e.cfg.Price, DefaultPrice: e.defaultPrice,
	}, nil
}

// Names lists the models that Lookup would resolve, sorted.
func (r *Registry) Names() []string {
	var names []string
	for name := range r.models {
		if _, err := r.Lookup(name); err == nil {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// Price is the configured price of model name whether or not its provider
// is configured: what a recording of a run with that model is billed at
// when replayed.
func (r *Registry) Price(name string) (model.Price, bool) {
	e, ok := r.models[name]
	if !ok || e.cfg.Price == nil {
		return model.Price{}, false
	}
	return *e.cfg.Price, true
}

// Status is what the registry knows of one model, usable or not.
type Status struct {
	Name     string
	Provider string
	// Price is nil for a model without one (not usable).
	Price *model.Price
	// ProviderConfigured is false when the model's provider lacks its
	// key or base URL.
	ProviderConfigured bool
	// Usable is whether a run may use the model now.
	Usable bool
}

// Models lists every model the registry knows, usable or not, by name.
func (r *Registry) Models() []Status {
	out := make([]Status, 0, len(r.models))
	for name, e := range r.models {
		_, configured := r.providers[e.cfg.Provider]
		_, err := r.Lookup(name)
		st := Status{Name: name, Provider: e.cfg.Provider, ProviderConfigured: configured, Usable: err == nil}
		if e.cfg.Price != nil {
			p := *e.cfg.Price
			st.Price = &p
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ModelsFile is the format of the models file (the models-file setting):
//
//	{"models": [
//	  {"name": "openai/gpt-4o-mini", "provider": "openai",
//	   "price": {"input_micros_per_mtok": 150000, "output_micros_per_mtok": 600000}},
//	  {"name": "llama3.1:8b", "provider": "openai",
//	   "price": {"input_micros_per_mtok": 0, "output_micros_per_mtok": 0}}
//	]}
type ModelsFile struct {
	Models []ModelConfig `json:"models"`
}

// ParseModelsFile decodes a ModelsFile, refusing unknown fields so a typo in
// a price does not silently leave a model unpriced.
func ParseModelsFile(raw []byte) ([]ModelConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var f ModelsFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse models file: %w", err)
	}
	return f.Models, nil
}
