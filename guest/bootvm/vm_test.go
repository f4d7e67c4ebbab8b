package bootvm

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/sandboxid"
	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/netns"
	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/qemu"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// bootTimeout bounds a boot to a ready init; TCG on a loaded machine is
// slow, so it is generous (it bounds a hang, it does not measure speed).
const bootTimeout = 90 * time.Second

// guestCmdline is what the sandbox manager adds to the driver's kernel
// command line: the kernel's crypto self-tests cost a fifth of a boot under
// TCG and guard nothing the host relies on.
const guestCmdline = "cryptomgr.notests"

// vm is one booted guest.
type vm struct {
	machine vmm.Machine
	client  *vsockproto.Client
	hello   vsockproto.Hello
	// provision is what the test made the guest unique with, scratch
	// the scratch directory the guest made for it.
	provision vsockproto.Provision
	scratch   string
	// stop kills QEMU, waits for it and removes its network; it is
	// idempotent.
	stop func()
}

// boot starts a VM for the test the way a sandbox does, and stops it at
// cleanup.
func boot(t testing.TB) *vm {
	t.Helper()
	img := testenv.RequireVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	id := sandboxid.New()
	// A NIC for ConfigureNetwork, behind the product's firewall: sealed,
	// so the guest reaches nothing through it.
	network, err := netns.Create(ctx, id, netns.Config{Mode: netns.Sealed})
	if err != nil {
		t.Fatalf("create the sandbox network: %v", err)
	}
	t.Cleanup(func() { network.Close() })
	m, err := qemu.New("").Start(ctx, vmm.Config{
		ID:        id,
		Kernel:    img.Kernel,
		Initrd:    img.Initrd,
		RootDisk:  img.RootDisk,
		Cmdline:   guestCmdline,
		VCPUs:     1,
		MemoryMiB: 512,
		Dir:       t.TempDir(),
		Tap:       network.Tap(),
		MAC:       network.MAC(),
	})
	if err != nil {
		t.Fatalf("start the VM: %v", err)
	}
	var client *vsockproto.Client
	stop := sync.OnceFunc(func() {
		if client != nil {
			client.Close()
		}
		m.Close()
		network.Close()
	})
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("guest console:\n%s", m.Console())
		}
	})

	conn, err := m.DialGuest(ctx)
	if err != nil {
		t.Fatalf("connect to guest: %v\nconsole:\n%s", err, m.Console())
	}
	client = vsockproto.NewClient(conn)
	hello, err := client.Hello(ctx)
	if err != nil {
		t.Fatalf("hello: %v\nconsole:\n%s", err, m.Console())
	}
	p := vsockproto.Provision{
		Entropy:     make([]byte, vsockproto.MinProvisionEntropy),
		Hostname:    "bootvm-" + id,
		MachineID:   id + id + id[:8],
		ScratchName: "Boot" + id[:4],
	}
	rand.Read(p.Entropy)
	p.Time = time.Now()
	done, err := client.Provision(ctx, p)
	if err != nil {
		t.Fatalf("provision: %v\nconsole:\n%s", err, m.Console())
	}
	return &vm{machine: m, client: client, hello: hello, provision: p, scratch: done.ScratchDir, stop: stop}
}

// result is a finished command as the test sees it.
type result struct {
	status         vsockproto.ExitStatus
	stdout, stderr string
}

func (v *vm) run(t *testing.T, req vsockproto.ExecRequest) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	status, err := v.client.Exec(ctx, req, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("exec %+v: %v", req, err)
	}
	return result{status: status, stdout: stdout.String(), stderr: stderr.String()}
}

func (v *vm) shell(t *testing.T, script string) result {
	t.Helper()
	return v.run(t, vsockproto.ExecRequest{Shell: script})
}

// BenchmarkBoot measures QEMU launch to the guest's hello, the latency a
// sandbox user waits for before the first command.
func BenchmarkBoot(b *testing.B) {
	var uptime, initTime time.Duration
	for b.Loop() {
		v := boot(b)
		uptime += v.hello.KernelUptime
		initTime += v.hello.InitDuration
		v.stop()
	}
	b.ReportMetric(float64(uptime.Milliseconds())/float64(b.N), "guest-uptime-ms/op")
	b.ReportMetric(float64(initTime.Milliseconds())/float64(b.N), "init-ms/op")
}

// TestGuest boots one VM and runs the scenarios on it; boots under TCG
// cost seconds, so the scenarios share a guest where they can.
func TestGuest(t *testing.T) {
	v := boot(t)
	t.Logf("hello: %+v", v.hello)

	t.Run("hello", func(t *testing.T) {
		// The driver attaches vhost-vsock where the host has it, and a
		// virtio-serial port otherwise.
		want := "serial"
		if _, err := os.Stat("/dev/vhost-vsock"); err == nil {
			want = "vsock"
		}
		if v.hello.Transport != want {
			t.Errorf("transport = %q, want %s", v.hello.Transport, want)
		}
		if want := "/tmp/ephemeral-run-" + v.provision.ScratchName + "/scratch"; v.scratch != want {
			t.Errorf("scratch dir = %q, want %q", v.scratch, want)
		}
		if v.hello.KernelRelease == "" || v.hello.KernelUptime <= 0 || v.hello.InitDuration <= 0 {
			t.Errorf("hello lacks boot facts: %+v", v.hello)
		}
	})

	t.Run("identity", func(t *testing.T) {
		r := v.shell(t, "pwd; whoami; id -u; id -g; echo $HOME; stat -c %a:%U $(dirname $PWD)")
		want := strings.Join([]string{v.scratch, "worker", "1000", "1000", "/home/worker", "700:worker"}, "\n") + "\n"
		if r.stdout != want || r.status.Code != 0 {
			t.Errorf("got %q (exit %d, stderr %q), want %q", r.stdout, r.status.Code, r.stderr, want)
		}
	})

	t.Run("provisioned names and clock", func(t *testing.T) {
		before := time.Now()
		r := v.shell(t, "hostname; cat /etc/machine-id; date +%s.%N")
		after := time.Now()
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 3 || lines[0] != v.provision.Hostname || lines[1] != v.provision.MachineID {
			t.Fatalf("hostname, machine-id, date = %q (stderr %q), want %s, %s and the time", r.stdout, r.stderr, v.provision.Hostname, v.provision.MachineID)
		}
		assertClock(t, lines[2], before, after)
	})

	t.Run("argv and env", func(t *testing.T) {
		r := v.run(t, vsockproto.ExecRequest{Argv: []string{"printenv", "GREETING", "PATH", "LANG"}, Env: []string{"GREETING=hi there"}})
		want := "hi there\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nC.UTF-8\n"
		if r.stdout != want {
			t.Errorf("stdout = %q, want %q", r.stdout, want)
		}
	})

	t.Run("command not found", func(t *testing.T) {
		r := v.run(t, vsockproto.ExecRequest{Argv: []string{"no-such-tool", "x"}})
		if r.status.Code != 127 || !strings.Contains(r.stderr, "no-such-tool: command not found") {
			t.Errorf("got exit %d stderr %q, want 127 and 'command not found'", r.status.Code, r.stderr)
		}
	})

	t.Run("exit code and stderr", func(t *testing.T) {
		r := v.shell(t, "echo oops >&2; exit 3")
		if r.status.Code != 3 || r.stderr != "oops\n" {
			t.Errorf("got exit %d stderr %q", r.status.Code, r.stderr)
		}
	})

	t.Run("timeout kills the process group", func(t *testing.T) {
		r := v.run(t, vsockproto.ExecRequest{Shell: "sh -c 'sleep 1000 & sleep 1000'", Timeout: 2 * time.Second})
		if !r.status.TimedOut || r.status.Signal != 9 {
			t.Errorf("status = %+v, want timed out by SIGKILL", r.status)
		}
		left := v.shell(t, "pgrep -x sleep || true")
		if strings.TrimSpace(left.stdout) != "" {
			t.Errorf("sleep processes survive the timeout: %q", left.stdout)
		}
	})

	t.Run("background child holding stdout", func(t *testing.T) {
		r := v.shell(t, "sleep 600 & echo started")
		if r.status.Code != 0 || r.stdout != "started\n" {
			t.Errorf("got %+v %q", r.status, r.stdout)
		}
		v.shell(t, "pkill -x sleep")
	})

	t.Run("no resolver", func(t *testing.T) {
		r := v.shell(t, "curl -sS -m 5 https://example.com")
		if r.status.Code == 0 || !strings.Contains(r.stderr, "Could not resolve host") {
			t.Errorf("curl: exit %d stderr %q, want a resolve failure", r.status.Code, r.stderr)
		}
	})

	t.Run("files", func(t *testing.T) {
		ctx := context.Background()
		if err := v.client.WriteFile(ctx, vsockproto.FileRequest{Path: "in.txt", Mode: 0o600}, strings.NewReader("payload\n")); err != nil {
			t.Fatal(err)
		}
		r := v.shell(t, "stat -c '%a %U' in.txt; tr a-z A-Z < in.txt > out.txt")
		if r.stdout != "600 worker\n" {
			t.Errorf("written file: %q, want mode 600 owned by worker", r.stdout)
		}
		var out bytes.Buffer
		if err := v.client.ReadFile(ctx, vsockproto.FileRequest{Path: v.scratch + "/out.txt", MaxBytes: 100}, &out); err != nil {
			t.Fatal(err)
		}
		if out.String() != "PAYLOAD\n" {
			t.Errorf("read back %q", out.String())
		}
		if err := v.client.ReadFile(ctx, vsockproto.FileRequest{Path: "out.txt", MaxBytes: 3}, &bytes.Buffer{}); err == nil {
			t.Error("read of 8 bytes with MaxBytes 3 succeeded")
		}
		if err := v.client.ReadFile(ctx, vsockproto.FileRequest{Path: "/dev/zero"}, &bytes.Buffer{}); err == nil {
			t.Error("read of /dev/zero succeeded")
		}
	})

	t.Run("root is writable but only in RAM", func(t *testing.T) {
		r := v.run(t, vsockproto.ExecRequest{Shell: "echo x > /etc/proof && cat /etc/proof && findmnt -no FSTYPE /", User: "root"})
		if r.stdout != "x\noverlay\n" {
			t.Errorf("got %q (stderr %q)", r.stdout, r.stderr)
		}
	})

	t.Run("network configuration", func(t *testing.T) {
		err := v.client.ConfigureNetwork(context.Background(), vsockproto.NetConfig{
			Interface: "eth0", Address: "10.0.2.15/24", Gateway: "10.0.2.2", MTU: 1400, MAC: "02:00:5e:10:00:01",
		})
		if err != nil {
			t.Fatal(err)
		}
		r := v.shell(t, "ip -4 -o addr show dev eth0 | awk '{print $4}'; ip route show default | cut -d' ' -f1-3; cat /sys/class/net/eth0/mtu /sys/class/net/eth0/address")
		if want := "10.0.2.15/24\ndefault via 10.0.2.2\n1400\n02:00:5e:10:00:01\n"; r.stdout != want {
			t.Errorf("guest network = %q, want %q (stderr %q)", r.stdout, want, r.stderr)
		}
		if err := v.client.ConfigureNetwork(context.Background(), vsockproto.NetConfig{Interface: "eth9", Address: "10.0.0.2/24"}); err == nil {
			t.Error("configuring a missing interface succeeded")
		}
	})

	t.Run("worker can ping loopback", func(t *testing.T) {
		r := v.shell(t, "ping -c1 -W5 127.0.0.1 >/dev/null && ping -6 -c1 -W5 ::1 >/dev/null && echo ok")
		if r.stdout != "ok\n" {
			t.Errorf("ping as worker: exit %d stderr %q", r.status.Code, r.stderr)
		}
	})

	// Deferred: shutting down runs last.
	defer t.Run("shutdown powers the VM off", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		if err := v.client.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-v.machine.Done():
		case <-ctx.Done():
			t.Fatal("QEMU still runs after the guest acknowledged shutdown")
		}
	})
	t.Run("orphans are reaped", func(t *testing.T) {
		v.shell(t, "for i in 1 2 3; do (sleep 0.1 &) ; done; sleep 0.5")
		r := v.shell(t, "ps -eo stat= | grep -c Z || true")
		if strings.TrimSpace(r.stdout) != "0" {
			t.Errorf("zombies left: %q", r.stdout)
		}
	})
}

// The host holds the VM through its one connection: when the host hangs
// up (it destroyed the sandbox, or the daemon died) the guest powers off,
// and the VMM exits without anyone killing it.
func TestHostHangUpPowersOff(t *testing.T) {
	v := boot(t)
	v.client.Close()
	select {
	case <-v.machine.Done():
	case <-time.After(bootTimeout):
		t.Fatalf("QEMU still runs %v after the host hung up; console:\n%s", bootTimeout, v.machine.Console())
	}
	if !strings.Contains(v.machine.Console(), "host connection ended") {
		t.Errorf("the guest did not say why it powered off; console:\n%s", v.machine.Console())
	}
}

// clockTolerance bounds how far the guest's clock may be from the host's
// right after the host provisioned it. It is a correctness bound, not a
// speed measurement: provisioning sets the clock to within the time a
// frame takes; a guest that missed it is off by seconds (the RTC's whole
// seconds at a cold boot, the snapshot's age for a clone).
const clockTolerance = 250 * time.Millisecond

// assertClock checks that the guest's `date +%s.%N`, taken between before
// and after on the host, agrees with the host's clock.
func assertClock(t *testing.T, guestDate string, before, after time.Time) {
	t.Helper()
	secs, err := strconv.ParseFloat(guestDate, 64)
	if err != nil {
		t.Fatalf("guest date %q: %v", guestDate, err)
	}
	guest := time.Unix(0, int64(secs*1e9))
	if guest.Before(before.Add(-clockTolerance)) || guest.After(after.Add(clockTolerance)) {
		t.Errorf("guest clock %v, host clock %v..%v: off by more than %v", guest.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano), clockTolerance)
	}
}
