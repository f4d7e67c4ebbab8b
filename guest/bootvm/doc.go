// Package bootvm holds the guest's end-to-end tests: each boots the real
// image (kernel, initramfs with ephemeral-init, read-only root) through the
// product's QEMU driver (package vmm/qemu, so with the product's command
// line and confinement) on a sealed sandbox network (package netns), and
// talks to the init over the guest channel the driver picked, checking what
// a user of the sandbox would check. It has no non-test code but this doc.
package bootvm
