package vmm

import (
	"errors"
	"fmt"
	"os"
)

// ErrNoHardwareKVM is wrapped by HardwareKVM's error when KVM would not
// run a stock guest kernel at a useful speed (or at all).
var ErrNoHardwareKVM = errors.New("no hardware-assisted KVM")

// HardwareKVM reports whether guests can use KVM with hardware
// virtualization. It returns nil only when the host CPU advertises vmx or
// svm and /dev/kvm opens read-write; otherwise the error says why, and the
// caller should fall back to emulation (QEMU TCG).
//
// /dev/kvm existing is not enough: some hosts (PVM, a paravirtualized KVM
// inside an ordinary VM) offer /dev/kvm without vmx/svm, and stock guest
// kernels hang under it.
func HardwareKVM() error {
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return fmt.Errorf("%w: read cpu flags: %w", ErrNoHardwareKVM, err)
	}
	if err := virtualizationFlags(cpuinfo); err != nil {
		if _, statErr := os.Stat("/dev/kvm"); statErr == nil {
			return fmt.Errorf("%w: /dev/kvm exists but %w: it is paravirtualized KVM (such as PVM), under which stock guest kernels hang", ErrNoHardwareKVM, err)
		}
		return fmt.Errorf("%w: %w", ErrNoHardwareKVM, err)
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: open /dev/kvm: %w", ErrNoHardwareKVM, err)
	}
	f.Close()
	return nil
}

// virtualizationFlags checks the flags of the first CPU listed in cpuinfo
// text (the format of /proc/cpuinfo) for vmx (Intel VT-x) or svm (AMD-V).
func virtualizationFlags(cpuinfo []byte) error {
	flags, ok := firstCPUField(cpuinfo, "flags")
	if !ok {
		return errors.New("no flags line in /proc/cpuinfo")
	}
	if hasFlag(flags, "vmx") || hasFlag(flags, "svm") {
		return nil
	}
	return errors.New("the CPU has neither vmx nor svm")
}
