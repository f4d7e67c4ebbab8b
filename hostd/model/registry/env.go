package registry

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Environment variables read by ConfigFromEnv.
//
//	EPHEMERAL_OPENAI_BASE_URL          Chat Completions base URL, ending before
//	                                   /chat/completions (default OpenAI's;
//	                                   e.g. https://openrouter.ai/api/v1 or
//	                                   http://127.0.0.1:11434/v1 for Ollama)
//	EPHEMERAL_OPENAI_API_KEY           Bearer key (local servers may need none)
//	EPHEMERAL_OPENAI_MAX_TOKENS_FIELD  max_tokens or max_completion_tokens
//	                                   (default: the latter for OpenAI's own
//	                                   API, the former elsewhere)
//	EPHEMERAL_ANTHROPIC_BASE_URL       Messages base URL, ending before
//	                                   /v1/messages (default Anthropic's)
//	EPHEMERAL_ANTHROPIC_API_KEY        x-api-key
//	EPHEMERAL_MODELS_FILE              JSON file of further models and price
//	                                   overrides (see ModelsFile)
//
// A built-in provider is enabled when its API key or its base URL is set.
const (
	EnvOpenAIBaseURL        = "EPHEMERAL_OPENAI_BASE_URL"
	EnvOpenAIAPIKey         = "EPHEMERAL_OPENAI_API_KEY"
	EnvOpenAIMaxTokensField = "EPHEMERAL_OPENAI_MAX_TOKENS_FIELD"
	EnvAnthropicBaseURL     = "EPHEMERAL_ANTHROPIC_BASE_URL"
	EnvAnthropicAPIKey      = "EPHEMERAL_ANTHROPIC_API_KEY"
	EnvModelsFile           = "EPHEMERAL_MODELS_FILE"
)

// ModelsFile is the format of EPHEMERAL_MODELS_FILE:
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

// ConfigFromEnv reads the configuration from the environment through
// getenv (os.Getenv) and the models file through readFile (os.ReadFile).
func ConfigFromEnv(getenv func(string) string, readFile func(string) ([]byte, error)) (Config, error) {
	cfg := Config{
		OpenAI: ProviderConfig{
			BaseURL:        getenv(EnvOpenAIBaseURL),
			APIKey:         getenv(EnvOpenAIAPIKey),
			MaxTokensField: getenv(EnvOpenAIMaxTokensField),
		},
		Anthropic: ProviderConfig{
			BaseURL: getenv(EnvAnthropicBaseURL),
			APIKey:  getenv(EnvAnthropicAPIKey),
		},
	}
	if path := getenv(EnvModelsFile); path != "" {
		raw, err := readFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("registry: read %s: %w", EnvModelsFile, err)
		}
		models, err := ParseModelsFile(raw)
		if err != nil {
			return Config{}, fmt.Errorf("registry: %s %s: %w", EnvModelsFile, path, err)
		}
		cfg.Models = models
	}
	return cfg, nil
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
