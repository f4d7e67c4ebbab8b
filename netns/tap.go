package netns

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openTap creates a non-persistent tap device in the calling thread's
// network namespace. The device exists as long as a descriptor of the
// returned file is open anywhere. IFF_VNET_HDR lets the VMM pass checksum
// and segmentation offloads through (QEMU probes the flag on the fd).
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", name, os.NewSyscallError("ioctl TUNSETIFF", err))
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}
