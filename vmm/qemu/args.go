package qemu

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// accel is how QEMU runs guest code.
type accel string

const (
	// accelKVM needs hardware virtualization (vmm.HardwareKVM).
	accelKVM accel = "kvm"
	// accelTCG is QEMU's emulator, used where KVM cannot run the guest.
	accelTCG accel = "tcg"
)

// guestChardevID names the chardev of the virtio-serial guest channel.
const guestChardevID = "guest"

// tcgCacheMiB bounds TCG's cache of translated guest code. QEMU's default
// reserves 1 GiB and fills it as the guest runs new code: memory the
// VMM's cgroup limit would have to allow for on top of the guest's RAM.
// Full, the cache is flushed and refilled, which is what makes a small
// one slow: at 32 MiB python3 -c 1 took 1.5-3 times as long after a boot.
// Booting and importing a dozen Python modules fills about 106 MiB; at
// 128 MiB (and at 64) that work took as long as with the default, booted
// or restored (per-round ratios 0.8-1.05, medians of 6 and 10 rounds
// interleaved), and the VMM's peak memory was the same.
const tcgCacheMiB = 128

// launch is everything that decides QEMU's command line. Descriptor
// numbers are as the child sees them (exec.Cmd.ExtraFiles start at 3).
type launch struct {
	cfg    vmm.Config
	accel  accel
	tscKHz int
	// qmpFD is a listening Unix socket for QMP.
	qmpFD int
	// pidFile is where QEMU writes its pid; it also marks the process as
	// ours for KillLeftover.
	pidFile string
	// Exactly one guest channel: a vhost-vsock device whose descriptor
	// already holds vsockCID, or a virtio-serial port on the listening
	// Unix socket serialFD.
	vhostFD  int
	vsockCID uint32
	serialFD int
	// tapFD is the tap device when cfg.Tap is set.
	tapFD int
	// ramFD, when set, is a memory file backing guest RAM, mapped shared
	// (a template's) or private (a clone's) as ramShared says.
	ramFD     int
	ramShared bool
	// incomingFD, when set, is a clone's saved device state: QEMU starts
	// waiting for migrate-incoming instead of booting the kernel.
	incomingFD int
	// confine picks the seccomp filter and whether QEMU switches user.
	confine confinement
	// baseline leaves out everything the driver adds around the machine
	// (see Driver.Baseline): no confinement, no QMP, no pid file, not
	// paused, and a network device without a tap.
	baseline bool
}

// args returns QEMU's arguments (without argv[0]) for l.
func (l launch) args() ([]string, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	cfg := l.cfg
	machine := "microvm"
	if l.ramFD > 0 {
		machine += ",memory-backend=ram"
	}
	args := []string{
		"-name", "ephemeral-" + cfg.ID,
		// Nothing QEMU would add by itself: no default devices, no
		// config files, no display; a guest reboot ends the process.
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-M", machine,
	}
	if !l.baseline {
		args = append(args,
			// Paused until the driver sends cont over QMP: QEMU serves
			// QMP only after it has switched user (-runas), so no guest
			// instruction ever runs with QEMU still root.
			"-S",
			"-sandbox", l.confine.sandboxOption(),
		)
		if l.confine.runAs != "" {
			args = append(args,
				"-runas", l.confine.runAs,
				// The VM's private directory: nothing in it QEMU does
				// not already hold open, and as the unprivileged user it
				// cannot even list it. QEMU opens no path after
				// switching; its pid file is written before.
				"-chroot", cfg.Dir,
			)
		}
	}
	switch l.accel {
	case accelKVM:
		args = append(args, "-accel", "kvm", "-cpu", "host")
	case accelTCG:
		args = append(args,
			// A bounded translation cache (see tcgCacheMiB). A clone
			// translates only what it runs after its restore.
			"-accel", "tcg,tb-size="+strconv.Itoa(tcgCacheMiB),
			// -cpu max is pathologically slow under TCG; qemu64 boots
			// the cloud kernel in about 2 s. Without ARAT its local
			// APIC timer counts as stopping in deep idle, and with no
			// broadcast timer to stand in (microvm has no HPET) the
			// guest kernel keeps its periodic 250 Hz tick even when
			// idle: 2-3% of a host core per idle VM, 0.3-0.4% with it.
			"-cpu", "qemu64,+arat")
	}
	if l.ramFD > 0 {
		// QEMU opens the file by its /proc path before it confines
		// itself. A template's memfd is the daemon's own; a clone's is
		// sealed against writes, so the private mapping QEMU makes of it
		// is all a clone can change.
		args = append(args, "-object", fmt.Sprintf("memory-backend-file,id=ram,size=%dM,mem-path=/proc/self/fd/%d,share=%s",
			cfg.MemoryMiB, l.ramFD, onOff(l.ramShared)))
	}
	if l.incomingFD > 0 {
		args = append(args, "-incoming", "defer")
	}
	args = append(args,
		"-m", strconv.Itoa(cfg.MemoryMiB),
		"-smp", strconv.Itoa(cfg.VCPUs),
		"-kernel", cfg.Kernel,
		"-initrd", cfg.Initrd,
		"-append", kernelCmdline(l.accel, l.tscKHz, cfg.Cmdline),
		// The console goes to stdout, captured by the driver.
		"-serial", "stdio",
	)
	if !l.baseline {
		args = append(args,
			"-pidfile", l.pidFile,
			"-chardev", "socket,id=qmp,fd="+strconv.Itoa(l.qmpFD)+",server=on,wait=off",
			"-mon", "chardev=qmp,mode=control",
		)
	}
	args = append(args,
		"-drive", "id=root,if=none,format=raw,readonly=on,file="+optValue(cfg.RootDisk),
		"-device", "virtio-blk-device,drive=root",
		// Without an entropy source the guest's getrandom blocks for
		// seconds at boot under TCG (qemu64 has no RDRAND).
		"-device", "virtio-rng-device",
	)
	if l.vhostFD > 0 {
		args = append(args, "-device", fmt.Sprintf("vhost-vsock-device,guest-cid=%d,vhostfd=%d", l.vsockCID, l.vhostFD))
	} else {
		args = append(args,
			"-device", "virtio-serial-device",
			"-chardev", "socket,id="+guestChardevID+",fd="+strconv.Itoa(l.serialFD)+",server=on,wait=off",
			"-device", "virtserialport,chardev="+guestChardevID+",name="+vsockproto.SerialPortName,
		)
	}
	switch {
	case cfg.Tap != nil:
		args = append(args,
			"-netdev", "tap,id=net0,fd="+strconv.Itoa(l.tapFD),
			"-device", "virtio-net-device,netdev=net0,mac="+cfg.MAC.String(),
		)
	case l.baseline:
		// The sandbox's network device, on a hub nothing else joins.
		args = append(args,
			"-netdev", "hubport,id=net0,hubid=0",
			"-device", "virtio-net-device,netdev=net0",
		)
	}
	return args, nil
}

// check rejects configurations QEMU would misread or refuse late. The
// Config's own rules (vmm.Config.Validate) keep its values safe inside
// QEMU's options, e.g. an ID without commas.
func (l launch) check() error {
	cfg := l.cfg
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !l.baseline && !filepath.IsAbs(l.pidFile) {
		errs = append(errs, fmt.Errorf("pid file path %q is not absolute", l.pidFile))
	}
	if l.accel != accelKVM && l.accel != accelTCG {
		errs = append(errs, fmt.Errorf("accelerator %q: want kvm or tcg", l.accel))
	}
	if l.tscKHz <= 0 {
		errs = append(errs, fmt.Errorf("tsc frequency %d kHz: want a positive rate", l.tscKHz))
	}
	if !l.baseline && l.qmpFD < 3 {
		errs = append(errs, fmt.Errorf("qmp descriptor %d: want an inherited one (>= 3)", l.qmpFD))
	}
	if l.baseline && (cfg.Tap != nil || l.ramFD > 0 || l.vhostFD > 0) {
		errs = append(errs, errors.New("a baseline has no tap, RAM file or vhost-vsock"))
	}
	if (l.vhostFD >= 3) == (l.serialFD >= 3) {
		errs = append(errs, errors.New("want exactly one guest channel: vhost-vsock or virtio-serial"))
	}
	if l.vhostFD >= 3 && l.vsockCID < 3 {
		errs = append(errs, fmt.Errorf("guest cid %d: want at least 3", l.vsockCID))
	}
	if l.incomingFD > 0 && (l.incomingFD < 3 || l.ramFD < 3 || l.ramShared) {
		errs = append(errs, fmt.Errorf("incoming state %d: want an inherited one with a private RAM file (RAM %d)", l.incomingFD, l.ramFD))
	}
	if l.ramFD > 0 && l.serialFD < 3 {
		errs = append(errs, errors.New("a RAM file (template or clone) wants the virtio-serial channel"))
	}
	if cfg.Tap != nil && l.tapFD < 3 {
		errs = append(errs, fmt.Errorf("tap descriptor %d: want an inherited one (>= 3)", l.tapFD))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("qemu: launch: %w", err)
	}
	return nil
}

// kernelCmdline is the driver's kernel command line followed by the
// caller's (later parameters win where the kernel reads one twice).
func kernelCmdline(a accel, tscKHz int, extra string) string {
	params := []string{
		"console=ttyS0",
		// microvm has no timer to calibrate the TSC against; the kernel's
		// own calibration can hang there.
		"tsc_early_khz=" + strconv.Itoa(tscKHz),
		// A panicking guest reboots at once, which -no-reboot turns into
		// QEMU exiting: the driver sees it as Done.
		"panic=-1",
	}
	if a == accelTCG {
		// The emulated TSC is the host's and keeps good time, but the
		// clocksource watchdog checks it against jiffies, which lag when
		// the emulator is starved of host CPU; it would then switch the
		// guest to jiffies and its clock would drift.
		params = append(params, "tsc=reliable")
	}
	if extra = strings.TrimSpace(extra); extra != "" {
		params = append(params, extra)
	}
	return strings.Join(params, " ")
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// optValue escapes s for the value part of a QEMU option list, where a
// comma separates options and ",," stands for a literal comma.
func optValue(s string) string {
	return strings.ReplaceAll(s, ",", ",,")
}
