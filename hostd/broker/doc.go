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
// reserved, an IPv6 address outside 2000::/3 (IPv4-compatible, SIIT,
// local-use NAT64 among them), Teredo, or a NAT64, 6to4 or ISATAP form of a
// refused IPv4 address, and then dials exactly the address it checked, so
// a name that re-resolves differently (DNS rebinding) cannot redirect it.
// Request heads and bodies and response bodies are capped, TRACE is
// refused, hop-by-hop headers (also those a Connection header names, read
// from the upstream's raw response head) are dropped in both directions,
// and every connection, the guest's and the upstream's, carries one
// request only.
//
// # Connections
//
// Inside the VM a connection is plain HTTP at
// http://connections.internal/<name>/<path> through the proxy. The broker
// checks the method against the run's grant, canonicalises the path and
// forwards exactly that canonical path under the connection's base path
// (see canonicalSubpath: what some server could read as climbing out —
// "..;", "%252e", "%C0%AE", "．．", "...", "\", "%2F" — is refused rather
// than guessed at), drops every credential header the guest sent, adds the
// stored ones and forwards over HTTPS. The secrets never enter the VM.
//
// # Failing closed
//
// Whatever the broker cannot decide — a resolver error, a connection it
// cannot load or decrypt, a budget it cannot charge — is refused, never
// forwarded. Every refusal is an event on the run's timeline, also for
// requests net/http answers itself before the handler runs (a malformed
// head, a doubled Content-Length, an unsupported transfer coding, an
// oversized head): the guest's connection notices that answer. The
// agent's web_fetch and connection_request tools call the same Session, so
// the model and the code in the VM meet one policy and one canonicaliser.
package broker
