// Package bootvm holds the guest's end-to-end tests: each boots the real
// image (kernel, initramfs with ephemeral-init, read-only root) under QEMU
// and talks to the init over the virtio-serial transport, checking what a
// user of the sandbox would check. It has no non-test code but this doc.
package bootvm
