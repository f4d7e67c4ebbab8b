package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// Names of the tools that reach outside the VM through the run's broker.
const (
	WebFetchTool   = "web_fetch"
	ConnectionTool = "connection_request"
)

// maxHeadersPerCall bounds the headers one web or connection call may set.
const maxHeadersPerCall = 32

// requestProperties are the fields web_fetch and connection_request share.
var requestProperties = map[string]any{
	"method": map[string]any{"type": "string", "description": "HTTP method; GET when omitted."},
	"headers": map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"},
		"description": "Request headers. Credentials for connections are added by the host; do not send any."},
	"body": map[string]any{"type": "string", "description": "Request body (text)."},
}

func webFetchTool() model.Tool {
	props := map[string]any{"url": map[string]any{"type": "string", "description": "Absolute http:// or https:// URL."}}
	for k, v := range requestProperties {
		props[k] = v
	}
	return model.Tool{
		Name: WebFetchTool,
		Description: "Fetch a URL from the web through the host's broker and get the status, content type and body. " +
			"Redirects are not followed. Addresses inside private networks are refused.",
		InputSchema: mustSchema(props, "url"),
	}
}

// connectionTool lists the run's connections and the methods each was
// granted, so the model knows exactly what it may call.
func connectionTool(grants []runs.Connection) model.Tool {
	var names, methods, described []string
	for _, g := range grants {
		names = append(names, g.Name)
		for _, m := range g.Methods {
			if !slices.Contains(methods, m) {
				methods = append(methods, m)
			}
		}
		described = append(described, fmt.Sprintf("%s (%s)", g.Name, strings.Join(g.Methods, ", ")))
	}
	props := map[string]any{
		"connection": map[string]any{"type": "string", "enum": names, "description": "The connection to call."},
		"path": map[string]any{"type": "string",
			"description": "Path (with an optional query) under the connection's base URL, e.g. /customers?limit=5."},
	}
	for k, v := range requestProperties {
		props[k] = v
	}
	if len(methods) > 0 {
		props["method"] = map[string]any{"type": "string", "enum": methods,
			"description": "HTTP method; GET when omitted. Only the methods granted for the connection are allowed."}
	}
	return model.Tool{
		Name: ConnectionTool,
		Description: "Call one of the organisation's connections through the host's broker, which adds the stored " +
			"credentials. Granted: " + strings.Join(described, "; ") + ".",
		InputSchema: mustSchema(props, "connection", "path"),
	}
}

func mustSchema(props map[string]any, required ...string) json.RawMessage {
	b, err := json.Marshal(map[string]any{
		"type": "object", "properties": props, "required": required, "additionalProperties": false,
	})
	if err != nil {
		panic(fmt.Sprintf("agent: tool schema: %v", err))
	}
	return b
}

// requestArgs are the HTTP parts of a web or connection call.
type requestArgs struct {
	Method  string            `json:"method,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
}

type webFetchArgs struct {
	URL string `json:"url"`
	requestArgs
}

type connectionArgs struct {
	Connection string `json:"connection"`
	Path       string `json:"path"`
	requestArgs
}

// parseWebFetchArgs checks a web_fetch call's arguments. Whether the URL
// may be fetched is the broker's decision, not the parser's.
func parseWebFetchArgs(raw string) (broker.Request, error) {
	var args webFetchArgs
	if err := decodeArgs(WebFetchTool, raw, &args); err != nil {
		return broker.Request{}, err
	}
	if err := checkText("url", args.URL); err != nil {
		return broker.Request{}, err
	}
	return args.request(args.URL)
}

// parseConnectionArgs checks a connection_request call's arguments. Which
// connections, methods and paths are allowed is the broker's decision.
func parseConnectionArgs(raw string) (string, broker.Request, error) {
	var args connectionArgs
	if err := decodeArgs(ConnectionTool, raw, &args); err != nil {
		return "", broker.Request{}, err
	}
	if err := checkText("connection", args.Connection); err != nil {
		return "", broker.Request{}, err
	}
	if err := checkText("path", args.Path); err != nil {
		return "", broker.Request{}, err
	}
	req, err := args.request(args.Path)
	return args.Connection, req, err
}

func (a requestArgs) request(url string) (broker.Request, error) {
	req := broker.Request{Method: a.Method, URL: url}
	if a.Method != "" && !isToken(a.Method) {
		return broker.Request{}, fmt.Errorf("method %q is not an HTTP method", clip(a.Method, 40))
	}
	if len(a.Headers) > maxHeadersPerCall {
		return broker.Request{}, fmt.Errorf("%d headers, more than the limit of %d", len(a.Headers), maxHeadersPerCall)
	}
	if len(a.Headers) > 0 {
		req.Header = http.Header{}
	}
	for name, value := range a.Headers {
		if !isToken(name) {
			return broker.Request{}, fmt.Errorf("header name %q is not valid", clip(name, 40))
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return broker.Request{}, fmt.Errorf("header %s: value contains a line break or NUL", name)
		}
		req.Header.Add(name, value)
	}
	if a.Body != "" {
		req.Body = []byte(a.Body)
	}
	return req, nil
}

// checkText refuses an empty field and what no URL or name may hold:
// invalid UTF-8 and control characters.
func checkText(field, s string) error {
	switch {
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%s is empty", field)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", field)
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("%s contains control characters", field)
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2), as
// method and header names must be.
func isToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// egressCall is a web_fetch or connection_request call in flight. The
// broker puts it on the timeline and meters it; the agent only answers the
// model.
type egressCall struct {
	do      func(ctx context.Context) (*broker.Response, error)
	maxBody int

	resp *broker.Response
	err  error
}

func (c *egressCall) run(ctx context.Context) { c.resp, c.err = c.do(ctx) }

// forModel renders the response with its body clipped to maxBody bytes.
// A refusal is a tool error whose text says why, as the broker wrote it.
func (c *egressCall) forModel() (string, bool) {
	if c.err != nil {
		return c.err.Error(), true
	}
	var b strings.Builder
	fmt.Fprintf(&b, "status: %d %s\n", c.resp.Status, http.StatusText(c.resp.Status))
	if ct := c.resp.Header.Get("Content-Type"); ct != "" {
		fmt.Fprintf(&b, "content-type: %s\n", clip(string(bytes.ToValidUTF8([]byte(ct), []byte("\uFFFD"))), 200))
	}
	body := c.resp.Body
	switch {
	case len(body) == 0:
		b.WriteString("body: (empty)\n")
		return b.String(), false
	case len(body) > c.maxBody:
		fmt.Fprintf(&b, "body (the first %d of %d bytes; the rest is cut):\n", c.maxBody, len(body))
		body = body[:c.maxBody]
	default:
		fmt.Fprintf(&b, "body (%d bytes):\n", len(body))
	}
	b.Write(bytes.ToValidUTF8(body, []byte("\uFFFD")))
	if !bytes.HasSuffix(body, []byte("\n")) {
		b.WriteByte('\n')
	}
	return b.String(), false
}
