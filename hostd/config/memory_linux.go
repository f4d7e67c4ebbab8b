package config

import "golang.org/x/sys/unix"

// totalMemory is the host's RAM in bytes, 0 when unknown.
func totalMemory() uint64 {
	var info unix.Sysinfo_t
	if unix.Sysinfo(&info) != nil {
		return 0
	}
	return uint64(info.Totalram) * uint64(info.Unit)
}
