// Package vmproc holds what every VMM driver does with its VMM process
// alike: supervising it (its own process group, death with the daemon,
// reaping without ever signalling a reused pid), keeping a bounded tail of
// its output for diagnosis, and killing a VMM that a crashed daemon left
// running without ever signalling a process that merely inherited its pid.
package vmproc
