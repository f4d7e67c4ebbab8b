package image

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/pierrec/lz4/v4"
)

// A bzImage makes the guest decompress its own kernel before the kernel's
// clock even starts; under TCG that costs about 400 ms of every boot. The
// same kernel, decompressed once at build time, boots directly through its
// PVH entry point (QEMU microvm and Cloud Hypervisor both load such ELF
// files). extractPVHKernel does that decompression for LZ4 bzImages, the
// format of Debian's cloud kernel.

// Offsets in the bzImage's real-mode header (Documentation/arch/x86/boot.rst).
const (
	setupSectsOffset    = 0x1f1
	headerMagicOffset   = 0x202 // "HdrS"
	payloadOffsetOffset = 0x248 // from the start of the protected-mode code
	payloadLengthOffset = 0x24c
)

// lz4LegacyMagic starts an LZ4 stream in the legacy format that the kernel
// build uses; blocks of it decompress to at most 8 MiB.
const (
	lz4LegacyMagic    = 0x184c2102
	lz4LegacyBlockMax = 8 << 20
)

// xenNotePVHEntry is the ELF note type (XEN_ELFNOTE_PHYS32_ENTRY) that
// marks a kernel bootable through PVH.
const xenNotePVHEntry = 18

// extractPVHKernel writes the uncompressed kernel ELF inside bzImage to
// dst. It fails, leaving no dst, when the payload is not LZ4 or the kernel
// has no PVH entry point: callers then boot the bzImage.
func extractPVHKernel(bzImage, dst string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return fmt.Errorf("image: pvh kernel: %w", err)
	}
	payload, err := bzImagePayload(data)
	if err != nil {
		return fmt.Errorf("image: pvh kernel: %w", err)
	}
	vmlinux, err := decompressLZ4Legacy(payload)
	if err != nil {
		return fmt.Errorf("image: pvh kernel: %w", err)
	}
	if err := checkPVH(vmlinux); err != nil {
		return fmt.Errorf("image: pvh kernel: %w", err)
	}
	if err := os.WriteFile(dst, vmlinux, 0o644); err != nil {
		os.Remove(dst)
		return fmt.Errorf("image: pvh kernel: %w", err)
	}
	return nil
}

// bzImagePayload returns the compressed kernel a bzImage carries.
func bzImagePayload(data []byte) ([]byte, error) {
	if len(data) < payloadLengthOffset+4 || string(data[headerMagicOffset:headerMagicOffset+4]) != "HdrS" {
		return nil, errors.New("not a bzImage")
	}
	setupSects := int(data[setupSectsOffset])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(data[payloadOffsetOffset:]))
	length := int(binary.LittleEndian.Uint32(data[payloadLengthOffset:]))
	if start < 0 || length <= 0 || start+length > len(data) || start+length < start {
		return nil, fmt.Errorf("bzImage payload %d+%d outside the %d byte file", start, length, len(data))
	}
	return data[start : start+length], nil
}

// decompressLZ4Legacy decodes a legacy-format LZ4 stream. The kernel build
// appends the uncompressed size (4 bytes) to the stream; that and any
// trailing bytes shorter than a block header end it.
func decompressLZ4Legacy(src []byte) ([]byte, error) {
	if len(src) < 4 || binary.LittleEndian.Uint32(src) != lz4LegacyMagic {
		return nil, errors.New("payload is not LZ4 (legacy format)")
	}
	src = src[4:]
	var out bytes.Buffer
	block := make([]byte, lz4LegacyBlockMax)
	for len(src) > 4 {
		size := int(binary.LittleEndian.Uint32(src))
		if size == lz4LegacyMagic { // a concatenated stream
			src = src[4:]
			continue
		}
		if size <= 0 || size > lz4.CompressBlockBound(lz4LegacyBlockMax) || size > len(src)-4 {
			return nil, fmt.Errorf("lz4 block of %d bytes with %d left", size, len(src)-4)
		}
		n, err := lz4.UncompressBlock(src[4:4+size], block)
		if err != nil {
			return nil, fmt.Errorf("lz4 block: %w", err)
		}
		out.Write(block[:n])
		src = src[4+size:]
	}
	return out.Bytes(), nil
}

// checkPVH verifies that vmlinux is an x86-64 ELF with a PVH entry note.
func checkPVH(vmlinux []byte) error {
	f, err := elf.NewFile(bytes.NewReader(vmlinux))
	if err != nil {
		return fmt.Errorf("decompressed kernel: %w", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("decompressed kernel is for %v", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(io.LimitReader(p.Open(), 1<<20))
		if err != nil {
			return fmt.Errorf("decompressed kernel notes: %w", err)
		}
		if hasXenNote(notes, xenNotePVHEntry) {
			return nil
		}
	}
	return errors.New("kernel has no PVH entry point (CONFIG_PVH)")
}

// hasXenNote walks ELF notes (namesz, descsz, type, name, desc; 4-byte
// aligned) looking for a "Xen" note of type typ.
func hasXenNote(notes []byte, typ uint32) bool {
	align := func(n uint32) uint64 { return (uint64(n) + 3) &^ 3 }
	for len(notes) >= 12 {
		namesz := binary.LittleEndian.Uint32(notes)
		descsz := binary.LittleEndian.Uint32(notes[4:])
		ntype := binary.LittleEndian.Uint32(notes[8:])
		rest := notes[12:]
		if align(namesz)+align(descsz) > uint64(len(rest)) {
			return false
		}
		name := rest[:namesz]
		if ntype == typ && string(bytes.TrimRight(name, "\x00")) == "Xen" {
			return true
		}
		notes = rest[align(namesz)+align(descsz):]
	}
	return false
}
