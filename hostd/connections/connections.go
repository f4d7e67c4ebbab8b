// Package connections manages an organisation's connections to outside
// HTTP systems: a name, an HTTPS base URL, the methods runs may be granted
// and the headers (credentials) the broker adds to every call. The headers
// are sealed at rest with package seal and opened only when a run that was
// granted the connection starts; they are never printed or logged.
package connections

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// Connection is a connection with its headers in the clear.
type Connection struct {
	Name    string
	BaseURL *url.URL
	Methods []string
	Headers http.Header
}

// Methods a connection may allow. CONNECT, TRACE and OPTIONS have no
// business on an API connection.
var knownMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidName reports whether name can name a connection (it becomes the
// first path segment of http://connections.internal/<name>/).
func ValidName(name string) bool { return nameRE.MatchString(name) }

// ParseMethods parses "GET,HEAD" into distinct known methods.
func ParseMethods(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		if !slices.Contains(knownMethods, m) {
			return nil, fmt.Errorf("connections: method %q: want some of %s", m, strings.Join(knownMethods, ","))
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out, nil
}

// ParseHeader parses "Name: value" as given to `admin connection add --header`.
func ParseHeader(s string) (name, value string, err error) {
	name, value, ok := strings.Cut(s, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") || strings.ContainsAny(value, "\r\n\x00") {
		// The header itself may be a secret: never echo it.
		return "", "", fmt.Errorf("connections: header must look like 'Name: value'")
	}
	return http.CanonicalHeaderKey(name), value, nil
}

// ParseBaseURL accepts an absolute https URL without query, fragment or
// user info; http only when plainHTTP (test upstreams).
func ParseBaseURL(s string, plainHTTP bool) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("connections: base URL: %w", err)
	}
	switch {
	case u.Scheme != "https" && !(plainHTTP && u.Scheme == "http"):
		return nil, fmt.Errorf("connections: base URL %q: must be https", s)
	case u.Host == "" || u.Opaque != "":
		return nil, fmt.Errorf("connections: base URL %q: needs a host", s)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("connections: base URL %q: no user info, query or fragment", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// Registry stores connections with their headers sealed.
type Registry struct {
	store *store.Store
	key   *seal.Key
}

// NewRegistry returns a registry over st sealing with key.
func NewRegistry(st *store.Store, key *seal.Key) *Registry {
	return &Registry{store: st, key: key}
}

// sealContext binds a sealed header set to its organisation and name.
func sealContext(orgID, name string) string { return "connection\x00" + orgID + "\x00" + name }

// Add validates and stores c for orgID.
func (r *Registry) Add(ctx context.Context, orgID string, c Connection) error {
	if !ValidName(c.Name) {
		return fmt.Errorf("connections: name %q must match %s", c.Name, nameRE)
	}
	if c.BaseURL == nil || len(c.Methods) == 0 {
		return fmt.Errorf("connections: %s needs a base URL and methods", c.Name)
	}
	plain, err := json.Marshal(c.Headers)
	if err != nil {
		return fmt.Errorf("connections: encode headers: %w", err)
	}
	return r.store.AddConnection(ctx, store.ConnectionRecord{
		OrgID: orgID, Name: c.Name, BaseURL: c.BaseURL.String(), Methods: c.Methods,
		SealedHeaders: r.key.Seal(plain, sealContext(orgID, c.Name)), CreatedAt: time.Now(),
	})
}

// Lookup loads one connection with its headers opened.
func (r *Registry) Lookup(ctx context.Context, orgID, name string) (Connection, error) {
	rec, err := r.store.Connection(ctx, orgID, name)
	if err != nil {
		return Connection{}, err
	}
	plain, err := r.key.Open(rec.SealedHeaders, sealContext(orgID, name))
	if err != nil {
		return Connection{}, fmt.Errorf("connections: open headers of %q: %w", name, err)
	}
	var headers http.Header
	if err := json.Unmarshal(plain, &headers); err != nil {
		return Connection{}, fmt.Errorf("connections: decode headers of %q: %w", name, err)
	}
	u, err := url.Parse(rec.BaseURL)
	if err != nil {
		return Connection{}, fmt.Errorf("connections: stored base URL of %q: %w", name, err)
	}
	return Connection{Name: name, BaseURL: u, Methods: rec.Methods, Headers: headers}, nil
}

// Summary is what listing shows: never the header values.
type Summary struct {
	Name        string
	BaseURL     string
	Methods     []string
	HeaderNames []string
}

// List summarises an organisation's connections.
func (r *Registry) List(ctx context.Context, orgID string) ([]Summary, error) {
	recs, err := r.store.Connections(ctx, orgID)
	if err != nil {
		return nil, err
	}
	out := make([]Summary, 0, len(recs))
	for _, rec := range recs {
		c, err := r.Lookup(ctx, orgID, rec.Name)
		if err != nil {
			return nil, err
		}
		s := Summary{Name: rec.Name, BaseURL: rec.BaseURL, Methods: rec.Methods}
		for name := range c.Headers {
			s.HeaderNames = append(s.HeaderNames, name)
		}
		slices.Sort(s.HeaderNames)
		out = append(out, s)
	}
	return out, nil
}

// Remove deletes a connection.
func (r *Registry) Remove(ctx context.Context, orgID, name string) error {
	return r.store.RemoveConnection(ctx, orgID, name)
}
