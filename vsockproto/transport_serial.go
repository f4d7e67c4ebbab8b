package vsockproto

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// FileConn adapts an open character device, such as a virtio-serial port,
// to net.Conn. Deadlines work only when the file supports polling;
// otherwise the Set*Deadline methods return os.ErrNoDeadline. Closing the
// conn closes f.
func FileConn(f *os.File) net.Conn {
	return &fileConn{f: f}
}

type fileConn struct {
	f *os.File
}

func (c *fileConn) Read(p []byte) (int, error)         { return c.f.Read(p) }
func (c *fileConn) Write(p []byte) (int, error)        { return c.f.Write(p) }
func (c *fileConn) Close() error                       { return c.f.Close() }
func (c *fileConn) LocalAddr() net.Addr                { return fileAddr(c.f.Name()) }
func (c *fileConn) RemoteAddr() net.Addr               { return fileAddr(c.f.Name()) }
func (c *fileConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *fileConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *fileConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// fileAddr names the device a fileConn runs over.
type fileAddr string

func (a fileAddr) Network() string { return "file" }
func (a fileAddr) String() string  { return string(a) }

// OpenSerialPort opens the guest's virtio-serial port whose name (set by
// the host, e.g. QEMU's virtserialport name=) equals name.
func OpenSerialPort(name string) (*os.File, error) {
	return openSerialPort("/sys/class/virtio-ports", "/dev", name)
}

// openSerialPort finds the port in sysDir (one directory per port, such as
// vport0p1, holding a "name" file) and opens its node in devDir.
func openSerialPort(sysDir, devDir, name string) (*os.File, error) {
	ports, err := os.ReadDir(sysDir)
	if err != nil {
		return nil, fmt.Errorf("serial port %q: list ports: %w", name, err)
	}
	for _, port := range ports {
		portName, err := os.ReadFile(filepath.Join(sysDir, port.Name(), "name"))
		if err != nil || string(bytes.TrimSuffix(portName, []byte("\n"))) != name {
			continue // ports without a name are unnamed consoles
		}
		f, err := os.OpenFile(filepath.Join(devDir, port.Name()), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("serial port %q: open: %w", name, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("serial port %q: no such port in %s", name, sysDir)
}
