package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/ephemeralhq/ephemeral/hostd/broker"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/netns"
)

// BrokerPort is the port on the sandbox's gateway where a run's broker
// session listens; the proxy variables in the guest point at it.
const BrokerPort = 3128

// SandboxBoot boots runs' VMs with m. A run granted web or connections gets
// a brokered sandbox (its only way out is a session of b on BrokerPort, and
// its processes get the proxy variables and EPHEMERAL_CONNECTIONS_URL);
// every other run gets a sealed one. b may be nil where no run is granted
// either: such a run then fails to boot rather than go without its grants.
func SandboxBoot(m *sandbox.Manager, b *broker.Broker) BootFunc {
	return func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (Machine, error) {
		grants := broker.GrantsOf(spec)
		if !grants.NeedsBroker() {
			sb, err := m.Create(ctx, sandbox.Options{})
			if err != nil {
				return Machine{}, err
			}
			return Machine{VM: sb, Firewall: sb.Network()}, nil
		}
		if b == nil {
			return Machine{}, errors.New("agent: the run is granted web or connections, but no broker is configured")
		}
		return bootBrokered(ctx, m, b, grants, broker.RunObserver{Rec: rec})
	}
}

// bootBrokered creates a broker-mode sandbox and serves its session on the
// sandbox's gateway. Whatever was set up is undone if a later step fails.
func bootBrokered(ctx context.Context, m *sandbox.Manager, b *broker.Broker, grants broker.Grants, obs broker.Observer) (Machine, error) {
	var undo undoStack
	defer undo.run()
	sb, err := m.Create(ctx, sandbox.Options{
		Network: netns.Config{Mode: netns.Broker, BrokerPort: BrokerPort},
		Env:     grants.GuestEnv(),
	})
	if err != nil {
		return Machine{}, err
	}
	undo.push(func() { sb.Destroy() })
	session, err := b.Open(ctx, grants, obs)
	if err != nil {
		return Machine{}, fmt.Errorf("agent: open broker session: %w", err)
	}
	undo.push(func() { session.Close() })
	ln, err := sb.Network().Listen(ctx, BrokerPort)
	if err != nil {
		return Machine{}, fmt.Errorf("agent: broker listener: %w", err)
	}
	// Serve owns ln from here on, also when it fails.
	if err := session.Serve(ln); err != nil {
		return Machine{}, fmt.Errorf("agent: serve broker: %w", err)
	}
	undo.release()
	return Machine{VM: &brokeredVM{Sandbox: sb, session: session}, Egress: session, Firewall: sb.Network()}, nil
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

// undoStack runs the cleanup steps of a setup in reverse, unless the setup
// succeeded and released them.
type undoStack struct{ steps []func() }

func (u *undoStack) push(f func()) { u.steps = append(u.steps, f) }
func (u *undoStack) release()      { u.steps = nil }
func (u *undoStack) run() {
	for i := len(u.steps) - 1; i >= 0; i-- {
		u.steps[i]()
	}
	u.steps = nil
}
