package qemu

import (
	"bytes"
	"context"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// tapInThrowawayNamespace creates a tap device in a new network namespace
// that lives until the test ends, so the test touches no host network.
func tapInThrowawayNamespace(t *testing.T) *os.File {
	t.Helper()
	testenv.RequireRoot(t)
	type result struct {
		tap *os.File
		err error
	}
	created := make(chan result, 1)
	release := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		// Never unlocked: the thread carries the namespace and is retired
		// with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			created <- result{err: os.NewSyscallError("unshare", err)}
			return
		}
		tap, err := openTestTap("eph-test0")
		created <- result{tap, err}
		<-release
	}()
	t.Cleanup(func() {
		close(release)
		<-exited
	})
	r := <-created
	if r.err != nil {
		t.Fatalf("create tap: %v", r.err)
	}
	t.Cleanup(func() { r.tap.Close() })
	return r.tap
}

func openTestTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("ioctl TUNSETIFF", err)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

// The guest gets exactly one network interface, with the MAC asked for.
func TestBootWithTap(t *testing.T) {
	img := testenv.RequireVM(t)
	cfg := testConfig(t, img)
	cfg.Tap = tapInThrowawayNamespace(t)
	cfg.MAC = net.HardwareAddr{0x02, 0xe9, 0x00, 0x00, 0x00, 0x42}
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()

	m, err := New("").Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	client, _ := connectAndProvision(t, ctx, m)
	var stdout, stderr bytes.Buffer
	status, err := client.Exec(ctx, vsockproto.ExecRequest{
		Shell: "for i in /sys/class/net/*; do [ \"${i##*/}\" = lo ] || cat \"$i/address\"; done",
	}, nil, &stdout, &stderr)
	if err != nil || status.Code != 0 {
		t.Fatalf("list guest interfaces: %+v, %v; stderr %q", status, err, stderr.String())
	}
	if got := strings.Fields(stdout.String()); len(got) != 1 || got[0] != cfg.MAC.String() {
		t.Fatalf("guest interfaces have MACs %q, want exactly [%s]", got, cfg.MAC)
	}
	// The caller still owns the tap.
	if _, err := cfg.Tap.Stat(); err != nil {
		t.Errorf("tap closed by the driver: %v", err)
	}
}
