// Package anthropic is a model.Provider for Anthropic's Messages API with
// tool use: tools as {name, description, input_schema}, tool calls as
// tool_use content blocks, results as tool_result blocks in a user message.
//
// Only the non-streaming form is used: one POST {base}/v1/messages per turn,
// authenticated with x-api-key and pinned to an anthropic-version.
package anthropic

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

// DefaultBaseURL is Anthropic's API; the client appends /v1/messages.
const DefaultBaseURL = "https://api.anthropic.com"

// APIVersion is the anthropic-version header this client's wire types
// follow.
const APIVersion = "2023-06-01"

// DefaultMaxTokens is sent when a request sets no MaxTokens: the Messages
// API requires the field.
const DefaultMaxTokens = 4096

// Config says where and how to reach the API.
type Config struct {
	// BaseURL ends before /v1/messages; empty means DefaultBaseURL.
	BaseURL string
	APIKey  string
	// HTTP carries the requests (retries, size cap); its Provider name is
	// set to "anthropic" when empty.
	HTTP httpcall.Client
}

// Client talks to one Messages endpoint. It is safe for concurrent use.
type Client struct {
	url    string
	apiKey string
	http   httpcall.Client
}

// New checks cfg and returns a client.
func New(cfg Config) (*Client, error) {
	base := strings.TrimRight(cmp.Or(cfg.BaseURL, DefaultBaseURL), "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, fmt.Errorf("anthropic: base URL %q: want http:// or https://", base)
	}
	c := &Client{url: base + "/v1/messages", apiKey: cfg.APIKey, http: cfg.HTTP}
	if c.http.Provider == "" {
		c.http.Provider = "anthropic"
	}
	return c, nil
}

// Complete sends one Messages request.
func (c *Client) Complete(ctx context.Context, req model.Request) (model.Response, error) {
	body, err := json.Marshal(wireRequest(req))
	if err != nil {
		return model.Response{}, fmt.Errorf("anthropic: encode request: %w", err)
	}
	header := http.Header{}
	header.Set("anthropic-version", APIVersion)
	if c.apiKey != "" {
		header.Set("x-api-key", c.apiKey)
	}
	respBody, err := c.http.PostJSON(ctx, c.url, header, body, req.BeforeRetry)
	if err != nil {
		return model.Response{}, err
	}
	return ParseResponse(respBody)
}
