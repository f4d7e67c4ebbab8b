package image

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/pierrec/lz4/v4"
)

// fakeBzImage wraps payload the way the kernel build does: a real-mode
// header pointing at it, with the uncompressed size appended.
func fakeBzImage(payload []byte, uncompressed int) []byte {
	const setupSects = 1
	img := make([]byte, (setupSects+1)*512)
	img[setupSectsOffset] = setupSects
	copy(img[headerMagicOffset:], "HdrS")
	binary.LittleEndian.PutUint32(img[payloadOffsetOffset:], 16)
	body := append(make([]byte, 16), payload...)
	body = binary.LittleEndian.AppendUint32(body, uint32(uncompressed))
	binary.LittleEndian.PutUint32(img[payloadLengthOffset:], uint32(len(payload)+4))
	return append(img, body...)
}

// lz4Legacy compresses data into legacy-format LZ4 blocks.
func lz4Legacy(t *testing.T, data []byte, blockSize int) []byte {
	out := binary.LittleEndian.AppendUint32(nil, lz4LegacyMagic)
	for len(data) > 0 {
		n := min(blockSize, len(data))
		dst := make([]byte, lz4.CompressBlockBound(n))
		c, err := lz4.CompressBlock(data[:n], dst, nil)
		if err != nil || c == 0 {
			t.Fatalf("compress: %d, %v", c, err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(c))
		out = append(out, dst[:c]...)
		data = data[n:]
	}
	return out
}

func TestBzImagePayloadRoundTrip(t *testing.T) {
	data := bytes.Repeat([]byte("kernel text and data "), 50000)
	img := fakeBzImage(lz4Legacy(t, data, 64<<10), len(data))
	payload, err := bzImagePayload(img)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decompressLZ4Legacy(payload)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("decompressed %d bytes, want %d", len(got), len(data))
	}
	// Not an ELF, so no PVH kernel comes out of it, and no file is left.
	dir := t.TempDir()
	src := filepath.Join(dir, "vmlinuz")
	os.WriteFile(src, img, 0o644)
	if err := extractPVHKernel(src, filepath.Join(dir, "vmlinux")); err == nil {
		t.Error("extracted a PVH kernel from a payload that is no ELF")
	}
	if _, err := os.Stat(filepath.Join(dir, "vmlinux")); !os.IsNotExist(err) {
		t.Errorf("failed extraction left a file: %v", err)
	}
}

func TestBzImagePayloadRejectsGarbage(t *testing.T) {
	for name, img := range map[string][]byte{
		"empty":   nil,
		"no HdrS": make([]byte, 4096),
		"payload outside": func() []byte {
			b := fakeBzImage([]byte("x"), 1)
			binary.LittleEndian.PutUint32(b[payloadLengthOffset:], 1<<30)
			return b
		}(),
		"not lz4": fakeBzImage([]byte("\x1f\x8bgzip data here"), 10),
	} {
		payload, err := bzImagePayload(img)
		if err == nil {
			_, err = decompressLZ4Legacy(payload)
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestHasXenNote(t *testing.T) {
	note := func(name string, typ uint32, desc []byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(len(name)+1))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
		b = binary.LittleEndian.AppendUint32(b, typ)
		b = append(b, name...)
		b = append(b, 0)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return append(b, desc...)
	}
	pvh := append(note("GNU", 3, make([]byte, 20)), note("Xen", xenNotePVHEntry, []byte{0, 0, 0, 1})...)
	if !hasXenNote(pvh, xenNotePVHEntry) {
		t.Error("PVH note not found")
	}
	if hasXenNote(note("Xen", 6, []byte("linux\x00\x00\x00")), xenNotePVHEntry) {
		t.Error("found a PVH note among other Xen notes")
	}
	huge := binary.LittleEndian.AppendUint32(nil, 0xffffffff)
	huge = append(huge, make([]byte, 12)...)
	if hasXenNote(huge, xenNotePVHEntry) {
		t.Error("a note claiming 4 GiB was accepted")
	}
}

func FuzzDecompressLZ4Legacy(f *testing.F) {
	f.Add(binary.LittleEndian.AppendUint32(nil, lz4LegacyMagic))
	f.Add([]byte("\x02\x21\x4c\x18\x05\x00\x00\x00\x50hello"))
	f.Fuzz(func(t *testing.T, data []byte) {
		decompressLZ4Legacy(data)
		hasXenNote(data, xenNotePVHEntry)
	})
}
