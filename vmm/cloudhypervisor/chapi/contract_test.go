package chapi

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ephemeralhq/ephemeral/internal/testenv"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/internal/chspec"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/internal/fdhttp"
)

// recorded is one request as the stand-in VMM saw it.
type recorded struct {
	method, path string
	body         string
	files        int
	// violation is the contract's verdict; empty when the request is valid.
	violation string
}

// recordingVMM serves the API on a Unix socket, judges every request by the
// API description and answers from a table keyed by "METHOD path".
type recordingVMM struct {
	contract *chspec.Contract
	answers  map[string]fdhttp.Response

	mu       sync.Mutex
	requests []recorded
}

func (v *recordingVMM) handle(ctx context.Context, req *fdhttp.Request) fdhttp.Response {
	rec := recorded{method: req.Method, path: req.URL.Path, body: string(req.Body), files: len(req.Files)}
	for _, f := range req.Files {
		// Writing through the received descriptor proves it is the file
		// the client passed, not just some number.
		f.WriteString("written by the VMM\n")
		f.Close()
	}
	resp, ok := v.answers[req.Method+" "+req.URL.Path]
	if err := v.contract.ValidateRequest(ctx, req.Request, req.Body); err != nil {
		rec.violation = err.Error()
		resp = fdhttp.Response{Status: http.StatusBadRequest, Body: []string{"Error parsing request", err.Error()}}
	} else if !ok {
		resp = fdhttp.Response{Status: http.StatusNotFound}
	} else if err := v.contract.ValidateResponse(ctx, req.Request, resp.Status, http.Header{"Content-Type": {"application/json"}}, mustJSON(resp.Body)); err != nil {
		rec.violation = "test answer violates the contract: " + err.Error()
	}
	v.mu.Lock()
	v.requests = append(v.requests, rec)
	v.mu.Unlock()
	return resp
}

func (v *recordingVMM) last(t *testing.T) recorded {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.requests) == 0 {
		t.Fatal("the VMM received no request")
	}
	return v.requests[len(v.requests)-1]
}

func mustJSON(v any) []byte {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func loadContract(t *testing.T) *chspec.Contract {
	t.Helper()
	contract, err := chspec.Load(context.Background(), testenv.SharedReference(t, chspec.FileName))
	if err != nil {
		t.Fatal(err)
	}
	return contract
}

// startVMM serves v on a fresh socket until the test ends and returns a
// client for it.
func startVMM(t *testing.T, v *recordingVMM) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- fdhttp.Serve(ctx, ln, v.handle) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return NewClient(sock)
}

// bootConfig is the configuration the driver sends, in full.
func bootConfig() VMConfig {
	return VMConfig{
		Payload: Payload{Kernel: "/images/vmlinuz", Initramfs: "/images/initrd", Cmdline: "console=ttyS0 quiet"},
		CPUs:    &CPUs{Boot: 2, Max: 2},
		Memory:  &Memory{SizeBytes: 512 << 20},
		Disks:   []Disk{{Path: "/images/root.ext4", Readonly: true, ImageType: ImageTypeRaw, ID: "root"}},
		RNG:     &RNG{Src: "/dev/urandom"},
		Serial:  &Console{Mode: ConsoleTty},
		Console: &Console{Mode: ConsoleOff},
		Vsock:   &Vsock{CID: 3, Socket: "/run/vm/vsock.sock"},
	}
}

func TestClientRequestsMatchAPIDescription(t *testing.T) {
	noContent := fdhttp.Response{Status: http.StatusNoContent}
	vmm := &recordingVMM{
		contract: loadContract(t),
		answers: map[string]fdhttp.Response{
			"GET /api/v1/vmm.ping": {Status: http.StatusOK, Body: map[string]any{"version": "v53.0", "pid": 4242}},
			"GET /api/v1/vm.info": {Status: http.StatusOK, Body: map[string]any{
				"state":  "Running",
				"config": map[string]any{"payload": map[string]any{"kernel": "/images/vmlinuz"}, "vsock": map[string]any{"cid": 3, "socket": "/run/vm/vsock.sock"}},
			}},
			"PUT /api/v1/vm.create":    noContent,
			"PUT /api/v1/vm.boot":      noContent,
			"PUT /api/v1/vm.shutdown":  noContent,
			"PUT /api/v1/vm.delete":    noContent,
			"PUT /api/v1/vm.pause":     noContent,
			"PUT /api/v1/vm.resume":    noContent,
			"PUT /api/v1/vm.snapshot":  noContent,
			"PUT /api/v1/vm.restore":   noContent,
			"PUT /api/v1/vmm.shutdown": noContent,
			"PUT /api/v1/vm.add-net":   noContent,
		},
	}
	client := startVMM(t, vmm)
	ctx := context.Background()
	tap, err := os.Create(filepath.Join(t.TempDir(), "tap"))
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	restoreTap, err := os.Create(filepath.Join(t.TempDir(), "restore-tap"))
	if err != nil {
		t.Fatal(err)
	}
	defer restoreTap.Close()

	calls := []struct {
		name, method, path string
		files              int
		call               func() error
		check              func(t *testing.T, rec recorded)
	}{
		{name: "ping", method: "GET", path: "vmm.ping", call: func() error {
			pong, err := client.Ping(ctx)
			if err == nil && (pong.Version != "v53.0" || pong.PID != 4242) {
				t.Errorf("Ping = %+v, want version v53.0 pid 4242", pong)
			}
			return err
		}},
		{name: "create", method: "PUT", path: "vm.create", call: func() error { return client.Create(ctx, bootConfig()) },
			check: func(t *testing.T, rec recorded) {
				for _, want := range []string{`"console":{"mode":"Off"}`, `"serial":{"mode":"Tty"}`, `"readonly":true`, `"boot_vcpus":2`, `"size":536870912`} {
					if !strings.Contains(rec.body, want) {
						t.Errorf("vm.create body %s lacks %s", rec.body, want)
					}
				}
			}},
		{name: "add-net", method: "PUT", path: "vm.add-net", files: 1, call: func() error {
			dev, err := client.AddNet(ctx, Net{MAC: "52:54:00:12:34:56", NumQueues: 2, ID: "net0"}, tap)
			if dev != nil {
				t.Errorf("cold add-net returned device %+v, want none", dev)
			}
			return err
		}},
		{name: "boot", method: "PUT", path: "vm.boot", call: func() error { return client.Boot(ctx) }},
		{name: "info", method: "GET", path: "vm.info", call: func() error {
			info, err := client.Info(ctx)
			if err == nil && (info.State != StateRunning || info.Config.Vsock == nil || info.Config.Vsock.CID != 3) {
				t.Errorf("Info = %+v, want Running with vsock cid 3", info)
			}
			return err
		}},
		{name: "pause", method: "PUT", path: "vm.pause", call: func() error { return client.Pause(ctx) }},
		{name: "snapshot", method: "PUT", path: "vm.snapshot", call: func() error { return client.Snapshot(ctx, "file:///var/lib/snap") },
			check: func(t *testing.T, rec recorded) {
				if rec.body != `{"destination_url":"file:///var/lib/snap"}` {
					t.Errorf("vm.snapshot body = %s", rec.body)
				}
			}},
		{name: "resume", method: "PUT", path: "vm.resume", call: func() error { return client.Resume(ctx) }},
		{name: "shutdown", method: "PUT", path: "vm.shutdown", call: func() error { return client.Shutdown(ctx) }},
		{name: "delete", method: "PUT", path: "vm.delete", call: func() error { return client.Delete(ctx) }},
		{name: "restore", method: "PUT", path: "vm.restore", call: func() error {
			return client.Restore(ctx, RestoreConfig{SourceURL: "file:///var/lib/snap", Resume: true})
		}},
		{name: "restore with a new tap", method: "PUT", path: "vm.restore", files: 1, call: func() error {
			return client.Restore(ctx, RestoreConfig{SourceURL: "file:///var/lib/snap", NetFDs: []RestoredNet{{ID: "net0", NumFDs: 1}}}, restoreTap)
		}, check: func(t *testing.T, rec recorded) {
			if rec.body != `{"source_url":"file:///var/lib/snap","net_fds":[{"id":"net0","num_fds":1}]}` {
				t.Errorf("vm.restore body = %s", rec.body)
			}
		}},
		{name: "shutdown-vmm", method: "PUT", path: "vmm.shutdown", call: func() error { return client.ShutdownVMM(ctx) }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			if err := c.call(); err != nil {
				t.Fatalf("call: %v", err)
			}
			rec := vmm.last(t)
			if rec.violation != "" {
				t.Fatalf("request violates the API description: %s", rec.violation)
			}
			if rec.method != c.method || rec.path != "/api/v1/"+c.path {
				t.Errorf("request = %s %s, want %s /api/v1/%s", rec.method, rec.path, c.method, c.path)
			}
			if rec.files != c.files {
				t.Errorf("request carried %d descriptors, want %d", rec.files, c.files)
			}
			if c.check != nil {
				c.check(t, rec)
			}
		})
	}

	written, err := os.ReadFile(tap.Name())
	if err != nil {
		t.Fatal(err)
	}
	if string(written) != "written by the VMM\n" {
		t.Errorf("tap file holds %q: the descriptor passed to add-net did not reach the VMM", written)
	}
	if written, err := os.ReadFile(restoreTap.Name()); err != nil || string(written) != "written by the VMM\n" {
		t.Errorf("restore tap file holds %q (%v): the descriptor passed to vm.restore did not reach the VMM", written, err)
	}
	if err := client.Restore(ctx, RestoreConfig{SourceURL: "file:///s", NetFDs: []RestoredNet{{ID: "net0", NumFDs: 2}}}, restoreTap); err == nil {
		t.Error("Restore with fewer taps than net_fds counts was sent")
	}
}

func TestContractCatchesInvalidRequest(t *testing.T) {
	vmm := &recordingVMM{contract: loadContract(t), answers: map[string]fdhttp.Response{
		"PUT /api/v1/vm.create": {Status: http.StatusNoContent},
	}}
	client := startVMM(t, vmm)
	cfg := bootConfig()
	cfg.CPUs.Boot = 0 // the API requires at least one vCPU

	err := client.Create(context.Background(), cfg)

	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
		t.Fatalf("Create with 0 vCPUs: err = %v, want an APIError with status 400", err)
	}
	if rec := vmm.last(t); !strings.Contains(rec.violation, "boot_vcpus") {
		t.Errorf("violation = %q, want it to name boot_vcpus", rec.violation)
	}
}
