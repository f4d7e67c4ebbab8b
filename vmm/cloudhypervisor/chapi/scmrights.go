package chapi

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// maxFiles is the kernel's limit on descriptors in one SCM_RIGHTS message
// (SCM_MAX_FD).
const maxFiles = 253

// writeWithFiles writes wire to conn, passing files as SCM_RIGHTS on the
// first sendmsg. Cloud Hypervisor's HTTP server collects descriptors from
// the reads that make up a request, so they must travel with the request's
// own bytes, not before or after them.
func writeWithFiles(conn *net.UnixConn, wire []byte, files []*os.File) error {
	if len(files) == 0 {
		if _, err := conn.Write(wire); err != nil {
			return fmt.Errorf("write request: %w", err)
		}
		return nil
	}
	if len(files) > maxFiles {
		return fmt.Errorf("write request: %d descriptors, at most %d fit one message", len(files), maxFiles)
	}
	var n int
	err := withRawFDs(files, nil, func(fds []int) error {
		var err error
		n, _, err = conn.WriteMsgUnix(wire, unix.UnixRights(fds...), nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("sendmsg request with %d descriptors: %w", len(files), err)
	}
	// A stream socket may take part of the request; the descriptors went
	// with that part, the rest follows as plain bytes.
	if _, err := conn.Write(wire[n:]); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	return nil
}

// withRawFDs calls fn with the descriptor numbers of files, holding each
// file's descriptor valid for the duration. It uses the files' raw
// connections rather than Fd(), which would switch them to blocking mode:
// the mode lives in the open file description the VMM will share.
func withRawFDs(files []*os.File, fds []int, fn func([]int) error) error {
	if len(files) == 0 {
		return fn(fds)
	}
	raw, err := files[0].SyscallConn()
	if err != nil {
		return fmt.Errorf("%s: %w", files[0].Name(), err)
	}
	var inner error
	ctrlErr := raw.Control(func(fd uintptr) {
		inner = withRawFDs(files[1:], append(fds, int(fd)), fn)
	})
	if ctrlErr != nil {
		return errors.Join(fmt.Errorf("%s: %w", files[0].Name(), ctrlErr), inner)
	}
	return inner
}
