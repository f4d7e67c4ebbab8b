// Command ephemeral-init is PID 1 of an Ephemeral microVM. It boots the
// guest (kernel filesystems, modules, a read-only root with a RAM overlay),
// then serves the host's requests over vsock or virtio-serial. The host
// holds the VM through that one connection; when it ends the VM powers off.
// It must be built static (CGO_ENABLED=0).
package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/guest/initd"
	"github.com/ephemeralhq/ephemeral/guest/netconf"
	"github.com/ephemeralhq/ephemeral/guest/provision"
	"github.com/ephemeralhq/ephemeral/guest/service"
	"github.com/ephemeralhq/ephemeral/guest/worker"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// rootDisk is the first virtio-blk device: the image's ext4 root.
const rootDisk = "/dev/vda"

// deviceTimeout bounds the wait for the root disk to appear.
const deviceTimeout = 10 * time.Second

// hostname is the guest's name until the host's Provision gives it its own.
const hostname = "ephemeral"

var started = time.Now()

// logf writes to the kernel console (ttyS0), the one diagnosis aid a
// broken boot leaves.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "ephemeral-init +%dms: %s\n", time.Since(started).Milliseconds(), fmt.Sprintf(format, args...))
}

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "ephemeral-init: must run as PID 1 inside the guest VM")
		os.Exit(2)
	}
	ctx := context.Background()
	svc, hello, err := boot(ctx)
	if err != nil {
		fail(err)
	}
	logf("ready in %v (kernel uptime %v), serving over %s", hello.InitDuration.Round(time.Millisecond),
		hello.KernelUptime.Round(time.Millisecond), hello.Transport)
	// A snapshot taken from here on, before the host's first connection,
	// restores into a guest that greets its own host (see
	// vsockproto.WaitingForHost). Everything that must differ between such
	// clones comes with the host's Provision.
	fmt.Fprintln(os.Stdout, vsockproto.WaitingForHost)
	// The host holds the VM through this one connection. When it ends —
	// the host destroyed the sandbox, or the daemon died — nothing is left
	// to serve, so the VM powers off. That also stops the VMM of a crashed
	// daemon at once: the VMM drops privileges, which clears its
	// parent-death signal, so nothing else would until the next start-up's
	// reconciliation.
	err = serve(ctx, hello, svc)
	logf("host connection ended (%v); powering off", err)
	halt()
}

// fail ends the VM: PID 1 must not exit (the kernel would panic with a
// less useful message), and the host notices a powered-off VM.
func fail(err error) {
	logf("fatal: %v", err)
	halt()
}

// halt powers the VM off and never returns.
func halt() {
	if err := initd.PowerOff(); err != nil {
		logf("%v", err)
	}
	select {}
}

func boot(ctx context.Context) (*service.Service, vsockproto.Hello, error) {
	var hello vsockproto.Hello
	if err := initd.MountAll(initd.EarlyMounts); err != nil {
		return nil, hello, err
	}
	lim, err := initd.ReadLimits()
	if err != nil {
		return nil, hello, err
	}
	if err := initd.LoadModules(); err != nil {
		return nil, hello, err
	}
	logf("modules loaded")
	waitCtx, cancel := context.WithTimeout(ctx, deviceTimeout)
	defer cancel()
	if err := initd.WaitForDevice(waitCtx, rootDisk); err != nil {
		return nil, hello, err
	}
	if err := initd.SwitchToOverlayRoot(rootDisk, lim.OverlayMiB); err != nil {
		return nil, hello, err
	}
	if err := initd.MountAll(initd.WithSizes(initd.RootMounts, initd.RootMountSizes(lim))); err != nil {
		return nil, hello, err
	}
	if err := initd.MakeDevLinks(); err != nil {
		return nil, hello, err
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return nil, hello, fmt.Errorf("set hostname: %w", os.NewSyscallError("sethostname", err))
	}
	if err := netconf.LoopbackUp(); err != nil {
		return nil, hello, err
	}
	if _, err := worker.LookupAccount("/", worker.DefaultUser); err != nil {
		return nil, hello, err
	}
	if err := initd.PreloadFiles("/", initd.Preloaded); err != nil {
		return nil, hello, err
	}
	if err := initd.LimitUserProcesses(lim.UserProcesses()); err != nil {
		return nil, hello, err
	}
	groups, err := worker.NewCommandGroups(initd.CgroupRoot, lim.CommandProcesses, logf)
	if err != nil {
		return nil, hello, err
	}
	svc := &service.Service{
		Runner:      &worker.Runner{Reaper: worker.NewReaper(), Root: "/", Groups: groups},
		Identity:    func(p vsockproto.Provision) error { return provision.Apply("/", p) },
		ScratchBase: "/tmp",
		ScratchMiB:  lim.ScratchMiB,
		PowerOff:    initd.PowerOff,
		Logf:        logf,
	}

	uptime, err := kernelUptime()
	if err != nil {
		return nil, hello, err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, hello, fmt.Errorf("uname: %w", os.NewSyscallError("uname", err))
	}
	hello = vsockproto.Hello{
		ProtocolVersion: vsockproto.ProtocolVersion,
		KernelUptime:    uptime,
		InitDuration:    time.Since(started),
		Transport:       "serial",
		KernelRelease:   unix.ByteSliceToString(uts.Release[:]),
	}
	if vsockAvailable() {
		hello.Transport = "vsock"
	}
	return svc, hello, nil
}

// kernelUptime reads the first field of /proc/uptime.
func kernelUptime() (time.Duration, error) {
	data, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, fmt.Errorf("read uptime: %w", err)
	}
	field, _, _ := strings.Cut(string(data), " ")
	secs, err := strconv.ParseFloat(field, 64)
	if err != nil {
		return 0, fmt.Errorf("parse uptime %q: %w", data, err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// vsockAvailable reports whether the VM has a vsock device: the transport
// module loads without one, but then the local context id stays "any".
func vsockAvailable() bool {
	cid, err := vsock.ContextID()
	return err == nil && cid > vsock.Host && cid != math.MaxUint32
}

func serve(ctx context.Context, hello vsockproto.Hello, svc *service.Service) error {
	if hello.Transport == "vsock" {
		return serveVsock(ctx, hello, svc)
	}
	return serveSerial(ctx, hello, svc)
}

// serveVsock serves the first host connection on the vsock port.
func serveVsock(ctx context.Context, hello vsockproto.Hello, svc *service.Service) error {
	ln, err := vsockproto.ListenVsock(vsockproto.Port)
	if err != nil {
		return fmt.Errorf("listen on vsock port %d: %w", vsockproto.Port, err)
	}
	conn, err := ln.Accept()
	ln.Close() // one host per VM
	if err != nil {
		return fmt.Errorf("accept on vsock port %d: %w", vsockproto.Port, err)
	}
	defer conn.Close()
	return vsockproto.Serve(ctx, conn, hello, svc)
}

// serveSerial serves the virtio-serial port. Writing the hello blocks
// until the host connects; reads return EOF once it has hung up.
func serveSerial(ctx context.Context, hello vsockproto.Hello, svc *service.Service) error {
	port, err := vsockproto.OpenSerialPort(vsockproto.SerialPortName)
	if err != nil {
		return err
	}
	defer port.Close()
	return vsockproto.Serve(ctx, vsockproto.FileConn(port), hello, svc)
}
