package qemu

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vhostVsockSetGuestCID is VHOST_VSOCK_SET_GUEST_CID from
// <linux/vhost.h>: _IOW(VHOST_VIRTIO, 0x60, __u64).
const vhostVsockSetGuestCID = 0x4008af60

// cidAttempts bounds the search for a free guest CID; with random picks
// from two billion values a collision is already rare.
const cidAttempts = 16

// reserveVsockCID opens /dev/vhost-vsock and claims a free guest CID on
// it. QEMU gets the descriptor (vhostfd=) and sets the same CID again,
// which the kernel allows for the descriptor that already owns it: the
// CID is ours from here on and no other VM can race us to it.
//
// An error means vhost-vsock cannot be used on this host (no device, no
// module, no permission); the caller falls back to virtio-serial.
func reserveVsockCID() (*os.File, uint32, error) {
	f, err := os.OpenFile("/dev/vhost-vsock", os.O_RDWR, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("vhost-vsock: %w", err)
	}
	for range cidAttempts {
		cid, err := randomCID()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		err = setGuestCID(f, cid)
		if errors.Is(err, unix.EADDRINUSE) {
			continue
		}
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		return f, cid, nil
	}
	f.Close()
	return nil, 0, fmt.Errorf("vhost-vsock: no free guest cid after %d attempts", cidAttempts)
}

// randomCID picks from 3 (the first guest CID) to 2^31, well clear of the
// reserved VMADDR_CID_ANY (2^32-1).
func randomCID() (uint32, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("vhost-vsock: random cid: %w", err)
	}
	return 3 + binary.LittleEndian.Uint32(b[:])%(1<<31-3), nil
}

func setGuestCID(f *os.File, cid uint32) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("vhost-vsock: %w", err)
	}
	// The ioctl reads a __u64 through its argument.
	v := uint64(cid)
	var errno unix.Errno
	err = conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, vhostVsockSetGuestCID, uintptr(unsafe.Pointer(&v)))
	})
	if err != nil {
		return fmt.Errorf("vhost-vsock: %w", err)
	}
	if errno != 0 {
		return os.NewSyscallError("ioctl VHOST_VSOCK_SET_GUEST_CID", errno)
	}
	return nil
}
