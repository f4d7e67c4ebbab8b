package system

import (
	"context"
	"errors"
	"fmt"

	"github.com/ephemeralhq/ephemeral/hostd/agent"
	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/internal/cleanup"
	"github.com/ephemeralhq/ephemeral/netns"
)

// BrokerPort is the port on the sandbox's gateway where a run's broker
// session listens; the proxy variables in the guest point at it.
const BrokerPort = 3128

// grants are a run's permissions as the broker enforces them.
func grants(spec runs.Spec) broker.Grants {
	g := broker.Grants{OrgID: spec.OrgID, Web: spec.Web}
	for _, c := range spec.Connections {
		g.Connections = append(g.Connections, broker.ConnectionGrant{Name: c.Name, Methods: c.Methods})
	}
	return g
}

// sandboxBoot takes runs' VMs from the pool p (which starts one when it
// has none ready). A run granted web or connections gets a brokered
// sandbox (its only way out is a session of b on BrokerPort, and its
// processes get the proxy variables and EPHEMERAL_CONNECTIONS_URL); every
// other run gets a sealed one.
func sandboxBoot(p *sandbox.Pool, b *broker.Broker) agent.BootFunc {
	return func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (agent.Machine, error) {
		if !spec.NeedsEgress() {
			sb, err := p.Take(ctx, sandbox.Options{})
			if err != nil {
				return agent.Machine{}, err
			}
			return agent.Machine{VM: sb, Firewall: sb.Network()}, nil
		}
		return bootBrokered(ctx, p, b, grants(spec), RunObserver{Rec: rec})
	}
}

// bootBrokered takes a sandbox in broker mode and serves its session on the
// sandbox's gateway. Whatever was set up is undone if a later step fails.
func bootBrokered(ctx context.Context, p *sandbox.Pool, b *broker.Broker, g broker.Grants, obs broker.Observer) (agent.Machine, error) {
	var undo cleanup.Stack
	defer undo.Run()
	sb, err := p.Take(ctx, sandbox.Options{
		Network: netns.Config{Mode: netns.Broker, BrokerPort: BrokerPort},
		Env:     g.GuestEnv(),
	})
	if err != nil {
		return agent.Machine{}, err
	}
	undo.AddErr(sb.Destroy)
	session, err := b.Open(ctx, g, obs)
	if err != nil {
		return agent.Machine{}, fmt.Errorf("system: open broker session: %w", err)
	}
	undo.AddErr(session.Close)
	ln, err := sb.Network().Listen(ctx, BrokerPort)
	if err != nil {
		return agent.Machine{}, fmt.Errorf("system: broker listener: %w", err)
	}
	// Serve owns ln from here on, also when it fails.
	if err := session.Serve(ln); err != nil {
		return agent.Machine{}, fmt.Errorf("system: serve broker: %w", err)
	}
	undo.Release()
	return agent.Machine{VM: &brokeredVM{Sandbox: sb, session: session}, Egress: session, Firewall: sb.Network()}, nil
}

// brokeredVM is a sandbox whose broker session ends with it.
type brokeredVM struct {
	*sandbox.Sandbox
	session *broker.Session
}

// Destroy stops the broker first, so no request of the guest's is still
// being forwarded (or charged) when the VM is gone, then destroys the VM.
func (v *brokeredVM) Destroy() error {
	return errors.Join(v.session.Close(), v.Sandbox.Destroy())
}

// RunObserver records a broker session's events on a run's timeline and
// charges its web requests to the run's budget at the daemon's web price.
type RunObserver struct {
	Rec *runs.Recorder
}

// ChargeWeb charges one web request; it fails once the budget is spent,
// which also stops the run.
func (o RunObserver) ChargeWeb() error {
	return o.Rec.Charge(ledger.Usage{WebRequests: 1})
}

// Record appends the event at its start time. Hosts and paths are user
// content: under zero data retention only the numbers are kept.
func (o RunObserver) Record(e broker.Event) {
	category := timeline.Web
	data := map[string]any{"status": e.Status, "bytes": e.Bytes, "refused": e.Refused != ""}
	if e.Connection != "" {
		category = timeline.Connection
		data["connection"] = e.Connection
	}
	// A failed write loses one line of the timeline, not the request:
	// the Recorder's own store errors surface elsewhere.
	o.Rec.ContentEventAt(e.Start, category, e.Message(), data)
}
