// Package provision applies the host's vsockproto.Provision in the guest:
// it credits the host's entropy to the kernel and reseeds the kernel's
// CRNG, sets the wall clock, the hostname and /etc/machine-id.
//
// A guest restored from a snapshot wakes with the snapshot's memory: the
// same kernel random state, the clock of the moment the snapshot was taken,
// the same names. Applying a fresh Provision before anything else runs is
// what makes such a clone as unique as a cold-booted guest; cold boots get
// one too, for the time (the RTC they boot from has whole seconds only).
package provision

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// MachineIDPath is where the machine id lives, relative to the root.
const MachineIDPath = "etc/machine-id"

// Apply applies p to the running guest whose root filesystem is root:
// the entropy first, so that nothing after it (or after the
// acknowledgement) draws from the snapshot's random state.
func Apply(root string, p vsockproto.Provision) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if err := Reseed(p.Entropy); err != nil {
		return err
	}
	if err := SetClock(p.Time); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(p.Hostname)); err != nil {
		return fmt.Errorf("provision: set hostname: %w", os.NewSyscallError("sethostname", err))
	}
	return WriteMachineID(root, p.MachineID)
}

// Reseed mixes entropy into the kernel's input pool, credits all of it
// (it comes from the host's CSPRNG) and makes the kernel rekey its CRNG
// from that pool at once, rather than at its next scheduled reseed.
func Reseed(entropy []byte) error {
	f, err := os.OpenFile("/dev/random", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("provision: reseed: %w", err)
	}
	defer f.Close()
	info := randPoolInfo(entropy)
	if err := ioctl(f, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); err != nil {
		return fmt.Errorf("provision: reseed: add entropy: %w", err)
	}
	runtime.KeepAlive(info)
	if err := ioctl(f, unix.RNDRESEEDCRNG, 0); err != nil {
		return fmt.Errorf("provision: reseed: %w", err)
	}
	return nil
}

// randPoolInfo encodes struct rand_pool_info from <linux/random.h>:
// entropy_count (bits credited), buf_size (bytes), then the bytes.
func randPoolInfo(entropy []byte) []byte {
	info := make([]byte, 8, 8+len(entropy))
	binary.NativeEndian.PutUint32(info[0:], uint32(8*len(entropy)))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(entropy)))
	return append(info, entropy...)
}

func ioctl(f *os.File, req uint, arg uintptr) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), arg)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return os.NewSyscallError("ioctl", errno)
	}
	return nil
}

// SetClock sets the wall clock to t.
func SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("provision: set clock: %w", os.NewSyscallError("clock_settime", err))
	}
	return nil
}

// WriteMachineID replaces root's /etc/machine-id with id, atomically, as
// the read-only file systemd would leave.
func WriteMachineID(root, id string) error {
	path := filepath.Join(root, MachineIDPath)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".machine-id-*")
	if err != nil {
		return fmt.Errorf("provision: machine id: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(id + "\n")
	if err == nil {
		err = tmp.Chmod(0o444)
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("provision: machine id: %w", err)
	}
	return nil
}
