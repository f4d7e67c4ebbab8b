package sandbox

import (
	"fmt"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor"
	"github.com/ephemeralhq/ephemeral/vmm/qemu"
)

// Detect returns the VMM driver for choice: "qemu", "cloud-hypervisor", or
// "auto" (or empty), which picks Cloud Hypervisor where its binary and
// hardware virtualization exist and QEMU otherwise (QEMU itself uses KVM
// when it can and TCG when it can't).
func Detect(choice string) (vmm.Driver, error) {
	switch choice {
	case "", "auto":
	case "qemu":
		if err := qemu.Available(); err != nil {
			return nil, err
		}
		return qemu.New(""), nil
	case "cloud-hypervisor":
		if err := cloudhypervisor.Available(); err != nil {
			return nil, err
		}
		if err := vmm.HardwareKVM(); err != nil {
			return nil, fmt.Errorf("the cloud-hypervisor VMM needs hardware KVM: %w", err)
		}
		return cloudhypervisor.New(""), nil
	default:
		return nil, fmt.Errorf("sandbox: VMM %q: want auto, qemu or cloud-hypervisor", choice)
	}
	if cloudhypervisor.Available() == nil && vmm.HardwareKVM() == nil {
		return cloudhypervisor.New(""), nil
	}
	if err := qemu.Available(); err != nil {
		return nil, err
	}
	return qemu.New(""), nil
}
