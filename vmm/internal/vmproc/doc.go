// Package vmproc holds what every VMM driver does with its VMM process
// alike: keeping a bounded tail of its output for diagnosis, and killing a
// VMM that a crashed daemon left running without ever signalling a process
// that merely inherited its pid.
package vmproc
