package broker

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/connections"
)

// ConnectionsHost is the name under which the guest reaches connections:
// http://connections.internal/<name>/<path>, through the proxy.
const ConnectionsHost = "connections.internal"

// ConnectionsURL is the value of EPHEMERAL_CONNECTIONS_URL in the guest.
const ConnectionsURL = "http://" + ConnectionsHost

// Resolver resolves a name to addresses (a *net.Resolver).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Connections loads an organisation's connection with its secrets (a
// *connections.Registry).
type Connections interface {
	Lookup(ctx context.Context, orgID, name string) (connections.Connection, error)
}

// Limits bound what one request may move through the broker.
type Limits struct {
	MaxHeaderBytes   int   // request head from the guest; response head from upstream
	MaxRequestBytes  int64 // request body
	MaxResponseBytes int64 // response body, and what one CONNECT tunnel may download
	// MaxConns bounds one sandbox's simultaneous connections to the broker.
	MaxConns       int
	DialTimeout    time.Duration
	RequestTimeout time.Duration // whole request, head to last body byte
	TunnelTimeout  time.Duration // whole CONNECT tunnel
}

// DefaultLimits are used for every zero field of Config.Limits.
var DefaultLimits = Limits{
	MaxHeaderBytes:   32 << 10,
	MaxRequestBytes:  10 << 20,
	MaxResponseBytes: 32 << 20,
	MaxConns:         32,
	DialTimeout:      10 * time.Second,
	RequestTimeout:   2 * time.Minute,
	TunnelTimeout:    10 * time.Minute,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxHeaderBytes > 0 {
		d.MaxHeaderBytes = l.MaxHeaderBytes
	}
	if l.MaxRequestBytes > 0 {
		d.MaxRequestBytes = l.MaxRequestBytes
	}
	if l.MaxResponseBytes > 0 {
		d.MaxResponseBytes = l.MaxResponseBytes
	}
	if l.MaxConns > 0 {
		d.MaxConns = l.MaxConns
	}
	if l.DialTimeout > 0 {
		d.DialTimeout = l.DialTimeout
	}
	if l.RequestTimeout > 0 {
		d.RequestTimeout = l.RequestTimeout
	}
	if l.TunnelTimeout > 0 {
		d.TunnelTimeout = l.TunnelTimeout
	}
	return d
}

// TestHooks loosen the policy for tests whose upstreams live on loopback
// or in the test's own namespaces. The daemon never sets them and no flag
// or config file reaches them.
type TestHooks struct {
	// AllowAddress lets through an address CheckAddress forbids.
	AllowAddress func(netip.Addr) bool
	// PlainHTTPConnections lets a connection forward over plain http,
	// only to a loopback address.
	PlainHTTPConnections bool
	// RootCAs replaces the system's roots for upstream TLS.
	RootCAs *x509.CertPool
}

// Config configures a Broker.
type Config struct {
	// Resolver resolves web and connection hosts; nil is the system's.
	Resolver    Resolver
	Connections Connections
	// InProcess serves connections whose base URL has this host from a
	// handler in the daemon instead of the network (the example systems).
	InProcess map[string]http.Handler
	Limits    Limits
	// TunnelPorts are the ports CONNECT may reach; nil means 443 only.
	TunnelPorts []uint16
	// UnsafeTestHooks is for tests only; see TestHooks.
	UnsafeTestHooks *TestHooks
}

// Broker opens a Session per run. It is safe for concurrent use.
type Broker struct {
	resolver    Resolver
	connections Connections
	inProcess   map[string]http.Handler
	limits      Limits
	tunnelPorts []uint16
	hooks       TestHooks
}

// New returns a broker.
func New(cfg Config) *Broker {
	b := &Broker{
		resolver: cfg.Resolver, connections: cfg.Connections,
		inProcess: cfg.InProcess, limits: cfg.Limits.withDefaults(), tunnelPorts: cfg.TunnelPorts,
	}
	if len(b.tunnelPorts) == 0 {
		b.tunnelPorts = []uint16{443}
	}
	if b.resolver == nil {
		b.resolver = systemResolver{}
	}
	if cfg.UnsafeTestHooks != nil {
		b.hooks = *cfg.UnsafeTestHooks
	}
	return b
}

// Grants are what one run may reach through the broker.
type Grants struct {
	OrgID       string
	Web         bool
	Connections []ConnectionGrant
}

// ConnectionGrant lets a run call one of its organisation's connections
// with these HTTP methods.
type ConnectionGrant struct {
	Name    string
	Methods []string
}

// NeedsBroker reports whether a run with g needs a brokered sandbox at
// all; without it the sandbox stays sealed and gets no proxy variables.
func (g Grants) NeedsBroker() bool { return g.Web || len(g.Connections) > 0 }

// GuestEnv is what the guest's processes need besides the proxy variables
// the sandbox sets: where the run's connections are.
func (g Grants) GuestEnv() []string {
	if len(g.Connections) == 0 {
		return nil
	}
	return []string{"EPHEMERAL_CONNECTIONS_URL=" + ConnectionsURL}
}

// ErrNothingGranted is returned by Open for a run with neither web nor
// connections: such a sandbox gets no broker at all.
var ErrNothingGranted = errors.New("broker: run has neither web nor connections")

// Event is one request through the broker, forwarded or refused.
type Event struct {
	Start time.Time
	// Connection names the connection; empty for web requests.
	Connection string
	Method     string
	// Host is the web request's host (with the port when not the
	// scheme's default); Path the connection request's path.
	Host string
	Path string
	// Status is the response's status, or the broker's own when it
	// refused; 0 when the upstream failed after the request was sent.
	Status int
	Bytes  int64 // response body bytes passed back
	// Refused says why the broker refused, empty when it forwarded.
	Refused string
	// Err says why a forwarded request failed.
	Err string
}

// Observer is how a Session reports to its run: it charges and records
// on the run's bill and timeline.
type Observer interface {
	// ChargeWeb is called once per web request or tunnel the policy
	// admitted, before anything is sent; an error refuses the request.
	ChargeWeb() error
	// Record reports a request once it has ended or been refused.
	Record(Event)
}

// Open loads the run's connections with their secrets and returns the
// run's Session. Connections that cannot be loaded stay granted but answer
// 503: the run does not fail for a connection it may never call.
func (b *Broker) Open(ctx context.Context, g Grants, obs Observer) (*Session, error) {
	if !g.NeedsBroker() {
		return nil, ErrNothingGranted
	}
	s := newSession(b, g.Web, obs)
	for _, grant := range g.Connections {
		gc := &grantedConnection{name: grant.Name}
		s.connections[grant.Name] = gc
		if b.connections == nil {
			gc.unavailable = "no connection registry configured"
			continue
		}
		c, err := b.connections.Lookup(ctx, g.OrgID, grant.Name)
		if err != nil {
			gc.unavailable = "connection cannot be loaded"
			continue
		}
		gc.conn = c
		// Only what both the run and the organisation allow today.
		for _, m := range grant.Methods {
			if slices.Contains(c.Methods, m) {
				gc.methods = append(gc.methods, m)
			}
		}
	}
	return s, nil
}

// refusal is the broker's own answer: a status and a reason for the
// guest, the model and the timeline.
type refusal struct {
	status int
	reason string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("broker refused (%d %s): %s", r.status, http.StatusText(r.status), r.reason)
}

func refuse(status int, format string, args ...any) *refusal {
	return &refusal{status: status, reason: fmt.Sprintf(format, args...)}
}
