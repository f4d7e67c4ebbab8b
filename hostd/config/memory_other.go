//go:build !linux

package config

// totalMemory is unknown off Linux, where no VM runs: no pool by default.
func totalMemory() uint64 { return 0 }
