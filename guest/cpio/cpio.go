// Package cpio writes "newc" cpio archives, the format the Linux kernel
// unpacks as an initramfs. Only writing is needed: the image builder
// produces the archive and the kernel is its only reader.
package cpio

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// File type bits of the newc mode field (the st_mode values of Linux).
const (
	typeDir     = 0o040000
	typeRegular = 0o100000
	typeSymlink = 0o120000
	typeCharDev = 0o020000
)

// trailerName marks the end of the archive.
const trailerName = "TRAILER!!!"

// headerLen is the fixed part of a newc header: the magic and 13 fields of
// 8 hex digits.
const headerLen = 6 + 13*8

// Writer appends entries to a newc archive. Entries need no particular
// order except that a directory should precede what it contains, which the
// kernel needs to create the files.
type Writer struct {
	w       io.Writer
	offset  int64
	nextIno uint32
	closed  bool
}

// NewWriter returns a Writer that writes the archive to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, nextIno: 1}
}

// Entry describes one archive member. Perm holds only permission bits; the
// file type comes from the method that writes the entry.
type Entry struct {
	Name string
	Perm fs.FileMode
	UID  uint32
	GID  uint32
}

// Dir adds a directory.
func (w *Writer) Dir(e Entry) error {
	return w.write(e, typeDir, 2, 0, 0, nil, 0)
}

// File adds a regular file of size bytes read from body.
func (w *Writer) File(e Entry, size int64, body io.Reader) error {
	return w.write(e, typeRegular, 1, 0, 0, body, size)
}

// Symlink adds a symbolic link pointing at target.
func (w *Writer) Symlink(e Entry, target string) error {
	return w.write(e, typeSymlink, 1, 0, 0, strings.NewReader(target), int64(len(target)))
}

// CharDevice adds a character device node such as /dev/console (5, 1).
func (w *Writer) CharDevice(e Entry, major, minor uint32) error {
	return w.write(e, typeCharDev, 1, major, minor, nil, 0)
}

// Close writes the trailer. It does not close the underlying writer.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	// The trailer has inode 0 so that it never aliases a real entry.
	w.nextIno = 0
	return w.write(Entry{Name: trailerName}, 0, 1, 0, 0, nil, 0)
}

func (w *Writer) write(e Entry, fileType uint32, nlink, rdevMajor, rdevMinor uint32, body io.Reader, size int64) error {
	if w.closed && e.Name != trailerName {
		return errors.New("cpio: write after close")
	}
	name := strings.TrimPrefix(e.Name, "/")
	if name == "" || strings.ContainsRune(name, 0) {
		return fmt.Errorf("cpio: invalid entry name %q", e.Name)
	}
	if size < 0 || size > 0xffffffff {
		return fmt.Errorf("cpio: %s: size %d does not fit the newc format", name, size)
	}
	ino := w.nextIno
	if ino != 0 {
		w.nextIno++
	}
	mode := fileType | uint32(e.Perm.Perm()) | unixSpecialBits(e.Perm)
	fields := [13]uint32{
		ino, mode, e.UID, e.GID, nlink,
		0, // mtime: a fixed value keeps archives reproducible
		uint32(size),
		0, 0, // device of the archive's origin filesystem: irrelevant
		rdevMajor, rdevMinor,
		uint32(len(name) + 1), // name size counts the NUL
		0,                     // checksum: only used by the "crc" variant
	}
	var hdr strings.Builder
	hdr.Grow(headerLen + len(name) + 4)
	hdr.WriteString("070701")
	for _, f := range fields {
		fmt.Fprintf(&hdr, "%08X", f)
	}
	hdr.WriteString(name)
	hdr.WriteByte(0)
	if err := w.emit([]byte(hdr.String())); err != nil {
		return fmt.Errorf("cpio: %s: write header: %w", name, err)
	}
	if err := w.pad(); err != nil {
		return fmt.Errorf("cpio: %s: write header: %w", name, err)
	}
	if size > 0 {
		n, err := io.Copy(countingWriter{w}, io.LimitReader(body, size))
		if err != nil {
			return fmt.Errorf("cpio: %s: write body: %w", name, err)
		}
		if n != size {
			return fmt.Errorf("cpio: %s: body has %d bytes, header says %d", name, n, size)
		}
		if err := w.pad(); err != nil {
			return fmt.Errorf("cpio: %s: write body: %w", name, err)
		}
	}
	return nil
}

// unixSpecialBits translates Go's setuid/setgid/sticky flags into st_mode bits.
func unixSpecialBits(m fs.FileMode) uint32 {
	var bits uint32
	if m&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	return bits
}

// pad aligns the archive to 4 bytes, as newc requires after names and bodies.
func (w *Writer) pad() error {
	var zeros [3]byte
	if n := (4 - w.offset%4) % 4; n > 0 {
		return w.emit(zeros[:n])
	}
	return nil
}

func (w *Writer) emit(p []byte) error {
	n, err := w.w.Write(p)
	w.offset += int64(n)
	return err
}

// countingWriter keeps Writer.offset right while io.Copy streams a body.
type countingWriter struct{ w *Writer }

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.w.Write(p)
	c.w.offset += int64(n)
	return n, err
}
