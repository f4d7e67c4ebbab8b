package sandbox

import (
	"fmt"
	"os"

	"github.com/ephemeralhq/ephemeral/vmm"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor"
	"github.com/ephemeralhq/ephemeral/vmm/qemu"
)

// Detect picks the machine's VMM: Cloud Hypervisor where its binary and
// hardware virtualization exist, QEMU otherwise (which itself uses KVM when
// it can and TCG when it can't). EPHEMERAL_VMM=qemu or cloud-hypervisor
// forces a choice.
func Detect() (vmm.Driver, error) {
	switch want := os.Getenv("EPHEMERAL_VMM"); want {
	case "":
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
			return nil, fmt.Errorf("EPHEMERAL_VMM=cloud-hypervisor needs hardware KVM: %w", err)
		}
		return cloudhypervisor.New(""), nil
	default:
		return nil, fmt.Errorf("EPHEMERAL_VMM=%q: want qemu or cloud-hypervisor", want)
	}
	if cloudhypervisor.Available() == nil && vmm.HardwareKVM() == nil {
		return cloudhypervisor.New(""), nil
	}
	if err := qemu.Available(); err != nil {
		return nil, err
	}
	return qemu.New(""), nil
}
