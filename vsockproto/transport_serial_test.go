package vsockproto

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeVirtioPorts lays out sysfs-like port directories and matching device
// files (regular files stand in for the character devices).
func fakeVirtioPorts(t *testing.T, names map[string]string) (sysDir, devDir string) {
	t.Helper()
	sysDir, devDir = t.TempDir(), t.TempDir()
	for port, name := range names {
		if err := os.Mkdir(filepath.Join(sysDir, port), 0o755); err != nil {
			t.Fatal(err)
		}
		if name != "" {
			if err := os.WriteFile(filepath.Join(sysDir, port, "name"), []byte(name+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(devDir, port), []byte(port), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return sysDir, devDir
}

func TestOpenSerialPortFindsByName(t *testing.T) {
	sysDir, devDir := fakeVirtioPorts(t, map[string]string{
		"vport0p0": "",
		"vport0p1": "org.qemu.guest_agent.0",
		"vport0p2": SerialPortName,
	})
	f, err := openSerialPort(sysDir, devDir, SerialPortName)
	if err != nil {
		t.Fatalf("openSerialPort: %v", err)
	}
	defer f.Close()
	if got := filepath.Base(f.Name()); got != "vport0p2" {
		t.Errorf("opened %s, want vport0p2", got)
	}
}

func TestOpenSerialPortMissing(t *testing.T) {
	sysDir, devDir := fakeVirtioPorts(t, map[string]string{"vport0p1": "other"})
	_, err := openSerialPort(sysDir, devDir, SerialPortName)
	if err == nil || !strings.Contains(err.Error(), "no such port") {
		t.Errorf("err = %v, want a no such port error", err)
	}
}

func TestFileConnCarriesBytes(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rc, wc := FileConn(r), FileConn(w)
	defer rc.Close()
	if _, err := wc.Write([]byte("ping")); err != nil {
		t.Fatalf("write: %v", err)
	}
	wc.Close()
	buf := make([]byte, 8)
	n, err := rc.Read(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Errorf("read %q, %v; want ping", buf[:n], err)
	}
	if rc.LocalAddr().String() != r.Name() {
		t.Errorf("LocalAddr = %v, want %s", rc.LocalAddr(), r.Name())
	}
}
