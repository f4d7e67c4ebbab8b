package qemu

import (
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/internal/vmproc"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// serialLaunch is a valid TCG launch with the virtio-serial channel.
func serialLaunch() launch {
	return launch{
		cfg: vmm.Config{
			ID:        "0a1b2c3d4e5f",
			Kernel:    "/images/vmlinuz",
			Initrd:    "/images/initrd.cpio",
			RootDisk:  "/images/rootfs.ext4",
			Cmdline:   "ephemeral.debug=1",
			VCPUs:     2,
			MemoryMiB: 512,
			Dir:       "/run/ephemeral/vm1",
		},
		accel:    accelTCG,
		tscKHz:   2596146,
		qmpFD:    3,
		serialFD: 4,
		pidFile:  "/run/ephemeral/vm1/pid",
	}
}

// values returns every value given to flag in args.
func values(args []string, flag string) []string {
	var vs []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			vs = append(vs, args[i+1])
		}
	}
	return vs
}

func mustArgs(t *testing.T, l launch) []string {
	t.Helper()
	args, err := l.args()
	if err != nil {
		t.Fatalf("args: %v", err)
	}
	return args
}

func TestArgsTCG(t *testing.T) {
	args := mustArgs(t, serialLaunch())
	for _, flag := range []string{"-nodefaults", "-no-user-config", "-nographic", "-no-reboot"} {
		if !slices.Contains(args, flag) {
			t.Errorf("args lack %s: %q", flag, args)
		}
	}
	want := map[string][]string{
		"-M":       {"microvm"},
		"-object":  nil,
		"-accel":   {"tcg,tb-size=128"},
		"-cpu":     {"qemu64,+arat"},
		"-m":       {"512"},
		"-smp":     {"2"},
		"-kernel":  {"/images/vmlinuz"},
		"-initrd":  {"/images/initrd.cpio"},
		"-pidfile": {"/run/ephemeral/vm1/pid"},
		"-serial":  {"stdio"},
		"-mon":     {"chardev=qmp,mode=control"},
		"-drive":   {"id=root,if=none,format=raw,readonly=on,file=/images/rootfs.ext4"},
		"-device": {
			"virtio-blk-device,drive=root",
			"virtio-rng-device",
			"virtio-serial-device",
			"virtserialport,chardev=guest,name=" + vsockproto.SerialPortName,
		},
		"-chardev": {
			"socket,id=qmp,fd=3,server=on,wait=off",
			"socket,id=guest,fd=4,server=on,wait=off",
		},
		"-netdev":   nil,
		"-incoming": nil,
	}
	for flag, wantValues := range want {
		if got := values(args, flag); !slices.Equal(got, wantValues) {
			t.Errorf("%s values = %q, want %q", flag, got, wantValues)
		}
	}
}

func TestArgsKVM(t *testing.T) {
	l := serialLaunch()
	l.accel = accelKVM
	args := mustArgs(t, l)
	if got := values(args, "-accel"); !slices.Equal(got, []string{"kvm"}) {
		t.Errorf("-accel = %q, want kvm", got)
	}
	if got := values(args, "-cpu"); !slices.Equal(got, []string{"host"}) {
		t.Errorf("-cpu = %q, want host", got)
	}
	// Under KVM the guest uses kvm-clock; the TSC watchdog stays on.
	if cmdline := values(args, "-append"); len(cmdline) != 1 || strings.Contains(cmdline[0], "tsc=reliable") {
		t.Errorf("KVM kernel command line %q: want exactly one, without tsc=reliable", cmdline)
	}
}

func TestKernelCmdline(t *testing.T) {
	args := mustArgs(t, serialLaunch())
	appended := values(args, "-append")
	if len(appended) != 1 {
		t.Fatalf("-append given %d times: %q", len(appended), appended)
	}
	params := strings.Fields(appended[0])
	for _, p := range []string{"console=ttyS0", "tsc_early_khz=2596146", "panic=-1", "tsc=reliable"} {
		if !slices.Contains(params, p) {
			t.Errorf("kernel command line %q lacks %s", appended[0], p)
		}
	}
	// The caller's parameters come last so they override the driver's.
	if params[len(params)-1] != "ephemeral.debug=1" {
		t.Errorf("kernel command line %q does not end with Config.Cmdline", appended[0])
	}
}

func TestArgsVhostVsock(t *testing.T) {
	l := serialLaunch()
	l.serialFD, l.vhostFD, l.vsockCID = 0, 4, 1234567
	args := mustArgs(t, l)
	devices := values(args, "-device")
	if !slices.Contains(devices, "vhost-vsock-device,guest-cid=1234567,vhostfd=4") {
		t.Errorf("-device values %q lack the vhost-vsock device", devices)
	}
	for _, d := range devices {
		if strings.HasPrefix(d, "virtio-serial") || strings.HasPrefix(d, "virtserialport") {
			t.Errorf("vsock launch also has serial device %q", d)
		}
	}
}

func TestArgsTap(t *testing.T) {
	l := serialLaunch()
	l.cfg.Tap = os.Stdin // any open file: only its presence matters here
	l.cfg.MAC = net.HardwareAddr{0x02, 0x00, 0x0a, 0xc8, 0x00, 0x02}
	l.tapFD = 5
	args := mustArgs(t, l)
	if got := values(args, "-netdev"); !slices.Equal(got, []string{"tap,id=net0,fd=5"}) {
		t.Errorf("-netdev = %q, want the tap on fd 5", got)
	}
	if devices := values(args, "-device"); !slices.Contains(devices, "virtio-net-device,netdev=net0,mac=02:00:0a:c8:00:02") {
		t.Errorf("-device values %q lack virtio-net with the MAC", devices)
	}
}

// A comma in a path must not end QEMU's option value and smuggle in
// another option.
// A template's RAM is the driver's memory file, mapped shared; a clone maps
// it private and waits for its saved state.
func TestArgsTemplateAndClone(t *testing.T) {
	tmpl := serialLaunch()
	tmpl.ramFD, tmpl.ramShared = 5, true
	args := mustArgs(t, tmpl)
	if got := values(args, "-M"); !slices.Equal(got, []string{"microvm,memory-backend=ram"}) {
		t.Errorf("template -M = %q", got)
	}
	if got := values(args, "-object"); !slices.Equal(got, []string{"memory-backend-file,id=ram,size=512M,mem-path=/proc/self/fd/5,share=on"}) {
		t.Errorf("template -object = %q", got)
	}
	if slices.Contains(args, "-incoming") {
		t.Errorf("template waits for an incoming migration: %q", args)
	}

	clone := serialLaunch()
	clone.ramFD, clone.incomingFD = 5, 6
	args = mustArgs(t, clone)
	if got := values(args, "-object"); !slices.Equal(got, []string{"memory-backend-file,id=ram,size=512M,mem-path=/proc/self/fd/5,share=off"}) {
		t.Errorf("clone -object = %q", got)
	}
	if got := values(args, "-incoming"); !slices.Equal(got, []string{"defer"}) {
		t.Errorf("clone -incoming = %q, want defer", got)
	}
	// Everything else is the template's: a clone's devices must match.
	if !slices.Contains(args, "-S") || !slices.Equal(values(args, "-device"), values(mustArgs(t, tmpl), "-device")) {
		t.Errorf("clone devices differ from the template's: %q", args)
	}
}

// A baseline is the sandbox's machine and nothing of the driver's around
// it; it boots at once.
func TestArgsBaseline(t *testing.T) {
	l := serialLaunch()
	l.baseline, l.qmpFD, l.pidFile = true, 0, ""
	l.confine = confinement{runAs: VMMUser}
	args := mustArgs(t, l)
	for _, flag := range []string{"-S", "-sandbox", "-runas", "-chroot", "-pidfile", "-mon"} {
		if slices.Contains(args, flag) {
			t.Errorf("baseline has %s: %q", flag, args)
		}
	}
	if got := values(args, "-netdev"); !slices.Equal(got, []string{"hubport,id=net0,hubid=0"}) {
		t.Errorf("baseline -netdev = %q, want a hub port", got)
	}
	sandbox := mustArgs(t, serialLaunch())
	for _, flag := range []string{"-M", "-accel", "-cpu", "-object", "-append", "-drive"} {
		if !slices.Equal(values(args, flag), values(sandbox, flag)) {
			t.Errorf("baseline %s = %q, the sandbox's is %q", flag, values(args, flag), values(sandbox, flag))
		}
	}
	wantDevices := append(values(sandbox, "-device"), "virtio-net-device,netdev=net0")
	if got := values(args, "-device"); !slices.Equal(got, wantDevices) {
		t.Errorf("baseline devices = %q, want the sandbox's and a NIC: %q", got, wantDevices)
	}
}

func TestArgsEscapeCommas(t *testing.T) {
	l := serialLaunch()
	l.cfg.RootDisk = "/images/a,readonly=off,file=/etc/shadow"
	drive := values(mustArgs(t, l), "-drive")
	want := "id=root,if=none,format=raw,readonly=on,file=/images/a,,readonly=off,,file=/etc/shadow"
	if !slices.Equal(drive, []string{want}) {
		t.Fatalf("-drive = %q, want %q", drive, want)
	}
}

func TestArgsRejectBadConfig(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*launch)
		wantErr string
	}{
		{"id with a comma", func(l *launch) { l.cfg.ID = "a,b" }, "id"},
		{"empty id", func(l *launch) { l.cfg.ID = "" }, "id"},
		{"relative kernel", func(l *launch) { l.cfg.Kernel = "vmlinuz" }, "kernel path"},
		{"no initrd", func(l *launch) { l.cfg.Initrd = "" }, "initrd path"},
		{"no vcpus", func(l *launch) { l.cfg.VCPUs = 0 }, "vcpus"},
		{"tiny memory", func(l *launch) { l.cfg.MemoryMiB = 16 }, "memory"},
		{"unknown accelerator", func(l *launch) { l.accel = "hvf" }, "accelerator"},
		{"no tsc rate", func(l *launch) { l.tscKHz = 0 }, "tsc"},
		{"two guest channels", func(l *launch) { l.vhostFD, l.vsockCID = 5, 9 }, "exactly one guest channel"},
		{"no guest channel", func(l *launch) { l.serialFD = 0 }, "exactly one guest channel"},
		{"reserved cid", func(l *launch) { l.serialFD, l.vhostFD, l.vsockCID = 0, 4, 2 }, "guest cid"},
		{"tap without mac", func(l *launch) { l.cfg.Tap, l.tapFD = os.Stdin, 5 }, "mac"},
		{"tap not passed", func(l *launch) { l.cfg.Tap, l.cfg.MAC = os.Stdin, net.HardwareAddr{2, 0, 0, 0, 0, 1} }, "tap descriptor"},
		{"relative pid file", func(l *launch) { l.pidFile = "pid" }, "pid file"},
		{"incoming without RAM file", func(l *launch) { l.incomingFD = 6 }, "incoming state"},
		{"incoming into shared RAM", func(l *launch) { l.incomingFD, l.ramFD, l.ramShared = 6, 5, true }, "incoming state"},
		{"RAM file over vhost-vsock", func(l *launch) { l.serialFD, l.vhostFD, l.vsockCID, l.ramFD = 0, 4, 9, 5 }, "virtio-serial"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := serialLaunch()
			tt.mutate(&l)
			args, err := l.args()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("args() = %q, %v; want an error containing %q", args, err, tt.wantErr)
			}
		})
	}
}

// The sockets the driver creates in Config.Dir fit a Unix socket address
// whenever the Dir is valid.
func TestSocketNamesFitTheDirBound(t *testing.T) {
	for _, name := range []string{qmpSocketName, guestSocketName} {
		if len(name) > vmm.MaxSocketNameLen {
			t.Errorf("socket name %q is longer than vmm.MaxSocketNameLen (%d)", name, vmm.MaxSocketNameLen)
		}
	}
}

func TestLaunchedFor(t *testing.T) {
	const pidFile = "/var/lib/ephemeral/vms/run_1/pid"
	argv := func(args ...string) []byte { return []byte(strings.Join(args, "\x00") + "\x00") }
	tests := []struct {
		name    string
		cmdline []byte
		want    bool
	}{
		{"our qemu", argv("/usr/bin/qemu-system-x86_64", "-name", "ephemeral-run_1", "-pidfile", pidFile, "-M", "microvm"), true},
		{"qemu of another vm", argv("qemu-system-x86_64", "-pidfile", "/var/lib/ephemeral/vms/run_2/pid"), false},
		{"reused pid, other program", argv("/usr/bin/sleep", "-pidfile", pidFile), false},
		{"pidfile flag last", argv("qemu-system-x86_64", "-pidfile"), false},
		{"kernel thread (empty cmdline)", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := launchedFor(vmproc.Argv(tt.cmdline), pidFile); got != tt.want {
				t.Fatalf("launchedFor(%q) = %v, want %v", tt.cmdline, got, tt.want)
			}
		})
	}
}

func TestRandomCIDRange(t *testing.T) {
	for range 1000 {
		cid, err := randomCID()
		if err != nil {
			t.Fatalf("randomCID: %v", err)
		}
		// 0-2 are the hypervisor, local and host; 2^32-1 is "any".
		if cid < 3 || cid >= 1<<31 {
			t.Fatalf("randomCID = %d, outside [3, 2^31)", cid)
		}
	}
}

func TestArgsConfinedToVMMUser(t *testing.T) {
	l := serialLaunch()
	l.confine = confinement{runAs: VMMUser, uid: "999"}
	args := mustArgs(t, l)
	want := map[string][]string{
		// elevateprivileges stays allowed: denying it would kill QEMU at
		// its own switch to the user.
		"-sandbox": {"on,obsolete=deny,spawn=deny,resourcecontrol=deny"},
		"-runas":   {VMMUser},
		"-chroot":  {"/run/ephemeral/vm1"},
	}
	for flag, wantValues := range want {
		if got := values(args, flag); !slices.Equal(got, wantValues) {
			t.Errorf("%s values = %q, want %q", flag, got, wantValues)
		}
	}
	// The driver lets the guest run only once QEMU has switched.
	if !slices.Contains(args, "-S") {
		t.Errorf("args lack -S: %q", args)
	}
}

// Without VMMUser QEMU stays root, with the strictest seccomp filter.
func TestArgsConfinedAsRoot(t *testing.T) {
	args := mustArgs(t, serialLaunch())
	if got := values(args, "-sandbox"); !slices.Equal(got, []string{"on,obsolete=deny,spawn=deny,resourcecontrol=deny,elevateprivileges=deny"}) {
		t.Errorf("-sandbox = %q, want every group denied", got)
	}
	for _, flag := range []string{"-runas", "-chroot"} {
		if got := values(args, flag); got != nil {
			t.Errorf("%s = %q without a user to switch to", flag, got)
		}
	}
	if !slices.Contains(args, "-S") {
		t.Errorf("args lack -S: %q", args)
	}
}

func TestConfinementSaysWhoQEMURunsAs(t *testing.T) {
	if got := (confinement{}).String(); !strings.Contains(got, "runs as root") || !strings.Contains(got, "install-deps") {
		t.Errorf("root confinement = %q: want it to say root and how to fix it", got)
	}
	if got := (confinement{runAs: VMMUser, uid: "999"}).String(); !strings.Contains(got, "runs as "+VMMUser) {
		t.Errorf("confinement = %q: want it to name %s", got, VMMUser)
	}
}

// switched reads a live /proc status: this test process's own.
func TestSwitched(t *testing.T) {
	self := strconv.Itoa(os.Getuid())
	tests := []struct {
		name string
		c    confinement
		want bool
	}{
		{"no user to switch to", confinement{}, true},
		{"runs as the user", confinement{runAs: "someone", uid: self}, true},
		{"not yet switched", confinement{runAs: "someone", uid: self + "0"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.c.switched(os.Getpid())
			if err != nil || got != tt.want {
				t.Fatalf("switched = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestStatusField(t *testing.T) {
	status := []byte("Name:\tqemu-system-x86\nUid:\t999\t999\t999\t999\nSeccomp:\t2\nSeccomp_filters:\t1\n")
	tests := []struct {
		name, want string
		wantErr    bool
	}{
		{"Uid", "999\t999\t999\t999", false},
		{"Seccomp", "2", false},
		{"Seccomp_filters", "1", false},
		{"Gid", "", true},
	}
	for _, tt := range tests {
		got, err := statusField(status, tt.name)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("statusField(%s) = %q, %v; want %q (error: %v)", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}
