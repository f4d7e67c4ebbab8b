package vsockproto

import (
	"context"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"
)

// ListenVsock listens on an AF_VSOCK port for connections to any local
// context id (the guest's own, or loopback). Port 0 picks a free port. It
// fails on systems without vsock support.
func ListenVsock(port uint32) (net.Listener, error) {
	ln, err := vsock.ListenContextID(unix.VMADDR_CID_ANY, port, nil)
	if err != nil {
		return nil, fmt.Errorf("vsock: listen on port %d: %w", port, err)
	}
	return ln, nil
}

// DialVsock connects from the host to port of the guest with context id
// cid (vhost-vsock). ctx bounds the connect.
func DialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	conn, err := vsock.DialContext(ctx, cid, port, nil)
	if err != nil {
		return nil, fmt.Errorf("vsock: dial cid %d port %d: %w", cid, port, err)
	}
	return conn, nil
}
