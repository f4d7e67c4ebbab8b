package netns

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/testenv"
)

// TestQEMUAcceptsTap checks that QEMU takes Tap() as a virtio-net backend.
// QEMU refuses vnet_hdr= next to fd=: it probes IFF_VNET_HDR on the fd
// itself and uses the header when the flag is set, as openTap does.
func TestQEMUAcceptsTap(t *testing.T) {
	requireRoot(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		testenv.Skip(t, "needs qemu-system-x86_64: apt-get install qemu-system-x86")
	}
	n := createNetwork(t, Config{Mode: Sealed})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-M", "microvm", "-accel", "tcg", "-cpu", "qemu64", "-m", "64",
		"-nodefaults", "-no-user-config", "-display", "none", "-S", "-qmp", "stdio",
		"-netdev", "tap,id=net0,fd=3",
		"-device", "virtio-net-device,netdev=net0,mac="+n.MAC().String())
	cmd.ExtraFiles = []*os.File{n.Tap()}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The QMP greeting comes once every device, the tap backend included,
	// is set up; a rejected tap makes QEMU exit before it.
	greeting, err := bufio.NewReader(stdout).ReadString('\n')
	_, _ = io.WriteString(stdin, `{"execute":"qmp_capabilities"}`+"\n"+`{"execute":"quit"}`+"\n")
	waitErr := cmd.Wait()
	if err != nil || !strings.Contains(greeting, `"QMP"`) {
		t.Fatalf("QEMU did not start with the tap: greeting %q (%v), exit %v, stderr:\n%s", greeting, err, waitErr, stderr.String())
	}
	if waitErr != nil {
		t.Errorf("QEMU quit: %v, stderr:\n%s", waitErr, stderr.String())
	}
}
