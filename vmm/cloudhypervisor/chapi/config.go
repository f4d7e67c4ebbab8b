package chapi

// The types below mirror the parts of Cloud Hypervisor's VmConfig (API
// description v53, components/schemas) that Ephemeral sets. Fields left at
// their zero value are omitted so the VMM applies its own defaults; modes
// whose VMM default is unwanted (the virtio console defaults to Tty) are set
// explicitly by the driver.

// VMConfig is the body of vm.create.
type VMConfig struct {
	Payload Payload  `json:"payload"`
	CPUs    *CPUs    `json:"cpus,omitempty"`
	Memory  *Memory  `json:"memory,omitempty"`
	Disks   []Disk   `json:"disks,omitempty"`
	Net     []Net    `json:"net,omitempty"`
	RNG     *RNG     `json:"rng,omitempty"`
	Serial  *Console `json:"serial,omitempty"`
	Console *Console `json:"console,omitempty"`
	Vsock   *Vsock   `json:"vsock,omitempty"`
	// Other fields of a VmConfig read back from vm.info are ignored.
}

// Payload is what the VM boots.
type Payload struct {
	Kernel    string `json:"kernel,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
}

// CPUs sizes the vCPU set; Boot and Max are equal for a VM that is never
// resized.
type CPUs struct {
	Boot int `json:"boot_vcpus"`
	Max  int `json:"max_vcpus"`
}

// Memory is the guest RAM.
type Memory struct {
	SizeBytes int64 `json:"size"`
}

// Disk is a block device backed by a host file.
type Disk struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly,omitempty"`
	// ImageType set to "Raw" spares the VMM probing the image header, which
	// guest-controlled content could otherwise steer.
	ImageType string `json:"image_type,omitempty"`
	ID        string `json:"id,omitempty"`
}

// ImageTypeRaw is a plain disk image.
const ImageTypeRaw = "Raw"

// Net is a virtio-net device. When its tap is passed as file descriptors
// (AddNet), Tap stays empty and NumQueues must be twice the number of
// descriptors.
type Net struct {
	Tap       string `json:"tap,omitempty"`
	MAC       string `json:"mac,omitempty"`
	MTU       int    `json:"mtu,omitempty"`
	NumQueues int    `json:"num_queues,omitempty"`
	QueueSize int    `json:"queue_size,omitempty"`
	ID        string `json:"id,omitempty"`
}

// RNG is the virtio-rng device and its host entropy source.
type RNG struct {
	Src string `json:"src"`
}

// ConsoleMode says where a console device's output goes.
type ConsoleMode string

// Console modes of the API description's ConsoleMode enum.
const (
	ConsoleOff    ConsoleMode = "Off"
	ConsolePty    ConsoleMode = "Pty"
	ConsoleTty    ConsoleMode = "Tty" // the VMM's own stdout
	ConsoleFile   ConsoleMode = "File"
	ConsoleSocket ConsoleMode = "Socket" // serial only
	ConsoleNull   ConsoleMode = "Null"
)

// Console configures the serial port or the virtio console.
type Console struct {
	Mode   ConsoleMode `json:"mode"`
	File   string      `json:"file,omitempty"`
	Socket string      `json:"socket,omitempty"`
}

// Vsock is the virtio-vsock device. The VMM listens on Socket; a host
// client selects a guest port with Cloud Hypervisor's hybrid vsock
// handshake.
type Vsock struct {
	CID    int64  `json:"cid"`
	Socket string `json:"socket"`
}

// RestoreConfig is the body of vm.restore.
type RestoreConfig struct {
	// SourceURL is the snapshot directory as a URL, "file:///path".
	SourceURL string `json:"source_url"`
	Prefault  bool   `json:"prefault,omitempty"`
	// NetFDs lists the saved VM's net devices that get new taps, passed
	// with the request (see Client.Restore). The published API
	// description lacks the field; v53 has it (see chspec's errata).
	NetFDs []RestoredNet `json:"net_fds,omitempty"`
	// Resume starts the restored VM instead of leaving it paused.
	Resume bool `json:"resume,omitempty"`
}

// RestoredNet gives the saved net device ID the next NumFDs descriptors
// passed with vm.restore.
type RestoredNet struct {
	ID     string `json:"id"`
	NumFDs int    `json:"num_fds"`
}

// PingResponse is the answer to vmm.ping.
type PingResponse struct {
	Version      string   `json:"version"`
	BuildVersion string   `json:"build_version,omitempty"`
	PID          int64    `json:"pid,omitempty"`
	Features     []string `json:"features,omitempty"`
}

// VMState is the VM's lifecycle state as vm.info reports it.
type VMState string

// States of the API description's VmState enum.
const (
	StateCreated    VMState = "Created"
	StateRunning    VMState = "Running"
	StateShutdown   VMState = "Shutdown"
	StatePaused     VMState = "Paused"
	StateBreakPoint VMState = "BreakPoint"
)

func (s VMState) known() bool {
	switch s {
	case StateCreated, StateRunning, StateShutdown, StatePaused, StateBreakPoint:
		return true
	}
	return false
}

// VMInfo is the answer to vm.info.
type VMInfo struct {
	Config           VMConfig `json:"config"`
	State            VMState  `json:"state"`
	MemoryActualSize int64    `json:"memory_actual_size,omitempty"`
}

// PCIDeviceInfo is the answer to hot-adding a device to a running VM.
type PCIDeviceInfo struct {
	ID  string `json:"id"`
	BDF string `json:"bdf"`
}
