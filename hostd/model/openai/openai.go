// Package openai is a model.Provider for the OpenAI Chat Completions API and
// the servers that copy it: OpenAI itself, OpenRouter (model names such as
// "openai/gpt-4o-mini"), and local servers (Ollama, vLLM, llama.cpp).
//
// Only the non-streaming form is used: one POST {base}/chat/completions per
// model turn, tools as "function" tools, tool results as role "tool"
// messages. Responses are parsed defensively: a tool call with invalid
// arguments is flagged rather than failing the turn.
package openai

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/httpcall"
)

// DefaultBaseURL is OpenAI's own API.
const DefaultBaseURL = "https://api.openai.com/v1"

// Names of the request field that bounds the answer's length. OpenAI's
// newer models accept only max_completion_tokens; many compatible servers
// know only max_tokens.
const (
	FieldMaxTokens           = "max_tokens"
	FieldMaxCompletionTokens = "max_completion_tokens"
)

// Config says where and how to reach the API.
type Config struct {
	// BaseURL ends before /chat/completions; empty means DefaultBaseURL.
	BaseURL string
	// APIKey is sent as a Bearer token; local servers may need none.
	APIKey string
	// MaxTokensField is FieldMaxTokens or FieldMaxCompletionTokens; empty
	// chooses max_completion_tokens for OpenAI's own API and max_tokens
	// for everything else.
	MaxTokensField string
	// HTTP carries the requests (retries, size cap); its Provider name is
	// set to "openai" when empty.
	HTTP httpcall.Client
}

// Client talks to one Chat Completions endpoint. It is safe for concurrent
// use.
type Client struct {
	url            string
	apiKey         string
	maxTokensField string
	http           httpcall.Client
}

// New checks cfg and returns a client.
func New(cfg Config) (*Client, error) {
	base := strings.TrimRight(cmp.Or(cfg.BaseURL, DefaultBaseURL), "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, fmt.Errorf("openai: base URL %q: want http:// or https://", base)
	}
	field := cfg.MaxTokensField
	switch field {
	case FieldMaxTokens, FieldMaxCompletionTokens:
	case "":
		field = FieldMaxTokens
		if base == DefaultBaseURL {
			field = FieldMaxCompletionTokens
		}
	default:
		return nil, fmt.Errorf("openai: max tokens field %q: want %s or %s", field, FieldMaxTokens, FieldMaxCompletionTokens)
	}
	c := &Client{url: base + "/chat/completions", apiKey: cfg.APIKey, maxTokensField: field, http: cfg.HTTP}
	if c.http.Provider == "" {
		c.http.Provider = "openai"
	}
	return c, nil
}

// Complete sends one Chat Completions request and returns its first choice.
func (c *Client) Complete(ctx context.Context, req model.Request) (model.Response, error) {
	body, err := json.Marshal(c.wireRequest(req))
	if err != nil {
		return model.Response{}, fmt.Errorf("openai: encode request: %w", err)
	}
	header := http.Header{}
	if c.apiKey != "" {
		header.Set("Authorization", "Bearer "+c.apiKey)
	}
	respBody, err := c.http.PostJSON(ctx, c.url, header, body, req.BeforeRetry)
	if err != nil {
		return model.Response{}, err
	}
	return ParseResponse(respBody)
}
