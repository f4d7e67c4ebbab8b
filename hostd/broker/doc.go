// Package broker is the only way out of a sandbox: an HTTP proxy on the
// host that forwards what a run was granted — web access (`web: true`) and
// calls to the organisation's connections — and refuses everything else.
//
// # Who is calling
//
// The broker serves one listener per sandbox, opened inside that sandbox's
// network namespace (netns.Network.Listen). A connection accepted on a
// listener can only have come from that sandbox's VM: namespaces share no
// route, and every sandbox uses the same guest address, so a source address
// would identify nothing. A Session therefore carries its run's grants by
// construction, and no request can name another run.
//
// # Web
//
// Absolute-form HTTP requests and CONNECT tunnels (HTTPS, port 443 only) are
// forwarded when the run has web access. The broker resolves the name once,
// refuses the request if any answer is loopback, private, link-local
// (metadata services included), CGNAT, unique-local, multicast, unspecified,
// reserved or an IPv4-mapped, NAT64 or 6to4 form of those, and then dials
// exactly the address it checked, so a name that re-resolves differently
// (DNS rebinding) cannot redirect it. Request heads and bodies and response
// bodies are capped, TRACE is refused, hop-by-hop headers are dropped and
// every upstream connection is used for one request only.
//
// # Connections
//
// Inside the VM a connection is plain HTTP at
// http://connections.internal/<name>/<path> through the proxy. The broker
// checks the method against the run's grant, keeps the path under the
// connection's base path (refusing dot segments and encoded separators),
// drops every credential header the guest sent, adds the stored ones and
// forwards over HTTPS. The secrets never enter the VM.
//
// # Failing closed
//
// Whatever the broker cannot decide — a resolver error, a connection it
// cannot load or decrypt, a budget it cannot charge — is refused, never
// forwarded. The agent's web_fetch and connection_request tools call the
// same Session, so the model and the code in the VM meet one policy.
package broker
