package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/internal/chspec"
	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/internal/fdhttp"
)

// Lifecycle states, named as vm.info reports them; stateNone is "no VM".
const (
	stateNone     = ""
	stateCreated  = "Created"
	stateRunning  = "Running"
	statePaused   = "Paused"
	stateShutdown = "Shutdown"
)

// vmm is the fake VMM's state. Requests are served one at a time, as the
// real VMM's API thread does.
type vmm struct {
	contract       *chspec.Contract
	fail, block    map[string]string
	refuseConnects int

	mu     sync.Mutex
	state  string
	config map[string]any
	taps   []*os.File // kept open for the VM's life, like the real VMM
	guest  *guest
	// exit ends serve once vmm.shutdown has been answered.
	exit context.CancelFunc
}

// serve answers the API on sock until ctx ends or vmm.shutdown.
func (v *vmm) serve(ctx context.Context, sock string) error {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on API socket: %w", err)
	}
	ctx, v.exit = context.WithCancel(ctx)
	defer v.exit()
	defer v.stopGuest()
	return fdhttp.Serve(ctx, ln, v.handle)
}

func (v *vmm) handle(ctx context.Context, req *fdhttp.Request) fdhttp.Response {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.contract.ValidateRequest(ctx, req.Request, req.Body); err != nil {
		closeAll(req.Files)
		fmt.Fprintf(os.Stderr, "fakech: request violates the API description: %v\n", err)
		return errorChain(http.StatusBadRequest, "Error parsing request", err.Error())
	}
	op := strings.TrimPrefix(req.URL.Path, "/api/v1/")
	if marker, ok := v.block[op]; ok {
		os.WriteFile(marker, nil, 0o644)
		<-ctx.Done() // never answer: a VMM wedged in this call
		closeAll(req.Files)
		return errorChain(http.StatusInternalServerError, "shutting down")
	}
	if msg, ok := v.fail[op]; ok {
		closeAll(req.Files)
		return errorChain(http.StatusInternalServerError, "Error in "+op, msg)
	}
	resp := v.dispatch(op, req)
	if resp.Status/100 == 2 {
		body, _ := json.Marshal(resp.Body)
		if resp.Body == nil {
			body = nil
		}
		header := http.Header{"Content-Type": {"application/json"}}
		if err := v.contract.ValidateResponse(ctx, req.Request, resp.Status, header, body); err != nil {
			fmt.Fprintf(os.Stderr, "fakech: own answer violates the API description: %v\n", err)
			return errorChain(http.StatusInternalServerError, "fakech answer invalid", err.Error())
		}
	}
	return resp
}

func (v *vmm) dispatch(op string, req *fdhttp.Request) fdhttp.Response {
	noContent := fdhttp.Response{Status: http.StatusNoContent}
	if op != "vm.add-net" && op != "vm.restore" {
		closeAll(req.Files) // only add-net and restore take descriptors
	}
	switch op {
	case "vmm.ping":
		return fdhttp.Response{Status: http.StatusOK, Body: map[string]any{"version": "v53.0-fakech", "pid": os.Getpid()}}
	case "vmm.shutdown":
		v.stopGuest()
		return fdhttp.Response{Status: http.StatusNoContent, After: v.exit}
	case "vm.restore":
		return v.restore(req)
	case "vm.create":
		if v.state != stateNone {
			return errorChain(http.StatusInternalServerError, "Error creating VM", "VM is already created")
		}
		if err := json.Unmarshal(req.Body, &v.config); err != nil {
			return errorChain(http.StatusBadRequest, "Error parsing VM configuration", err.Error())
		}
		v.state = stateCreated
		return noContent
	case "vm.info":
		if v.state == stateNone {
			return errorChain(http.StatusNotFound, "VM is not created")
		}
		return fdhttp.Response{Status: http.StatusOK, Body: map[string]any{"config": v.config, "state": v.state}}
	case "vm.add-net":
		return v.addNet(req)
	case "vm.boot":
		return v.boot()
	case "vm.pause":
		return v.transition(stateRunning, statePaused)
	case "vm.resume":
		if v.state == statePaused && v.guest == nil {
			// A restored VM's guest starts running here.
			if resp := v.startGuest(); resp.Status != 0 {
				return resp
			}
		}
		return v.transition(statePaused, stateRunning)
	case "vm.snapshot":
		return v.snapshot(req)
	case "vm.shutdown":
		if v.state != stateRunning && v.state != statePaused {
			return errorChain(http.StatusMethodNotAllowed, "Error shutting down VM", "VM is not running")
		}
		v.stopGuest()
		v.state = stateShutdown
		return noContent
	case "vm.delete":
		v.stopGuest()
		closeAll(v.taps)
		v.state, v.config, v.taps = stateNone, nil, nil
		return noContent
	}
	return errorChain(http.StatusNotFound, "fakech does not implement "+op)
}

func (v *vmm) transition(from, to string) fdhttp.Response {
	if v.state != from {
		return errorChain(http.StatusMethodNotAllowed, fmt.Sprintf("VM is %q, not %q", v.state, from))
	}
	v.state = to
	return fdhttp.Response{Status: http.StatusNoContent}
}

// addNet cold-adds a net device backed by the passed descriptors, checking
// them the way the real VMM does (num_queues is twice the descriptors, no
// stdio numbers) and writing a line into regular files so tests can see
// that the very file arrived.
func (v *vmm) addNet(req *fdhttp.Request) fdhttp.Response {
	if v.state != stateCreated {
		closeAll(req.Files)
		return errorChain(http.StatusInternalServerError, "Error adding net device", "fakech supports cold add only, VM is "+v.state)
	}
	var net map[string]any
	if err := json.Unmarshal(req.Body, &net); err != nil {
		closeAll(req.Files)
		return errorChain(http.StatusBadRequest, "Error parsing net configuration", err.Error())
	}
	queues := 2.0
	if q, ok := net["num_queues"].(float64); ok {
		queues = q
	}
	if len(req.Files) == 0 || float64(2*len(req.Files)) != queues {
		closeAll(req.Files)
		return errorChain(http.StatusBadRequest, "Error adding net device",
			fmt.Sprintf("Number of queues (%v) does not match twice the number of descriptors (%d)", queues, len(req.Files)))
	}
	for _, f := range req.Files {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			closeAll(req.Files)
			return errorChain(http.StatusBadRequest, "Error adding net device", "invalid descriptor: "+err.Error())
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			f.WriteString("fakech: tap queue received\n")
		}
	}
	v.taps = append(v.taps, req.Files...)
	nets, _ := v.config["net"].([]any)
	v.config["net"] = append(nets, net)
	return fdhttp.Response{Status: http.StatusNoContent}
}

// boot starts the "guest": a banner on the serial port and a vsock
// listener.
func (v *vmm) boot() fdhttp.Response {
	if v.state != stateCreated {
		return errorChain(http.StatusInternalServerError, "Error booting VM", "VM is "+v.state+", not Created")
	}
	payload, _ := v.config["payload"].(map[string]any)
	kernel, _ := payload["kernel"].(string)
	if _, err := os.Stat(kernel); err != nil {
		return errorChain(http.StatusInternalServerError, "Error booting VM", "Cannot load the kernel", err.Error())
	}
	if resp := v.startGuest(); resp.Status != 0 {
		return resp
	}
	cmdline, _ := payload["cmdline"].(string)
	fmt.Printf("[    0.000000] Linux version 6.1.0-fakech\n[    0.000000] Command line: %s\n", cmdline)
	// What the real guest init prints once it waits for its host.
	fmt.Println(waitingForHost)
	v.state = stateRunning
	return fdhttp.Response{Status: http.StatusNoContent}
}

// waitingForHost is vsockproto.WaitingForHost, which a template waits for.
const waitingForHost = "ephemeral-init: waiting for the host"

// startGuest listens on the configured vsock socket as the guest; the zero
// Response means it did.
func (v *vmm) startGuest() fdhttp.Response {
	vsock, _ := v.config["vsock"].(map[string]any)
	if sock, _ := vsock["socket"].(string); sock != "" {
		g, err := startGuest(sock, v.refuseConnects)
		if err != nil {
			return errorChain(http.StatusInternalServerError, "Error starting the guest", err.Error())
		}
		v.guest = g
	}
	return fdhttp.Response{}
}

// snapshot writes the paused VM into the destination directory the way the
// real VMM lays it out: its configuration, and stand-ins for the device
// state and memory.
func (v *vmm) snapshot(req *fdhttp.Request) fdhttp.Response {
	if v.state != statePaused {
		return errorChain(http.StatusInternalServerError, "Error snapshotting VM", "VM is "+v.state+", not Paused")
	}
	var body struct {
		DestinationURL string `json:"destination_url"`
	}
	json.Unmarshal(req.Body, &body)
	dir, ok := strings.CutPrefix(body.DestinationURL, "file://")
	if !ok {
		return errorChain(http.StatusInternalServerError, "Error snapshotting VM", "unsupported destination "+body.DestinationURL)
	}
	config, _ := json.Marshal(v.config)
	for name, data := range map[string][]byte{"config.json": config, "state.json": []byte("{}"), "memory-ranges": []byte("fakech memory")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return errorChain(http.StatusInternalServerError, "Error snapshotting VM", err.Error())
		}
	}
	return fdhttp.Response{Status: http.StatusNoContent}
}

// restore creates the VM from a snapshot directory, paused, giving each
// net device named in net_fds the descriptors passed, as the real VMM does.
func (v *vmm) restore(req *fdhttp.Request) fdhttp.Response {
	fail := func(chain ...string) fdhttp.Response {
		closeAll(req.Files)
		return errorChain(http.StatusInternalServerError, append([]string{"Error restoring VM"}, chain...)...)
	}
	if v.state != stateNone {
		return fail("VM is already created")
	}
	var body struct {
		SourceURL string `json:"source_url"`
		NetFDs    []struct {
			ID     string `json:"id"`
			NumFDs int    `json:"num_fds"`
		} `json:"net_fds"`
	}
	json.Unmarshal(req.Body, &body)
	dir, ok := strings.CutPrefix(body.SourceURL, "file://")
	if !ok {
		return fail("unsupported source " + body.SourceURL)
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return fail(err.Error())
	}
	var config map[string]any
	if err := json.Unmarshal(data, &config); err != nil {
		return fail(err.Error())
	}
	want := 0
	for _, n := range body.NetFDs {
		found := false
		nets, _ := config["net"].([]any)
		for _, raw := range nets {
			if net, _ := raw.(map[string]any); net["id"] == n.ID {
				found = true
			}
		}
		if !found {
			return fail("no net device " + n.ID + " in the snapshot")
		}
		want += n.NumFDs
	}
	if want != len(req.Files) {
		return fail(fmt.Sprintf("net_fds want %d descriptors, %d passed", want, len(req.Files)))
	}
	for _, f := range req.Files {
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			f.WriteString("fakech: tap queue restored\n")
		}
	}
	v.config, v.taps, v.state = config, req.Files, statePaused
	return fdhttp.Response{Status: http.StatusNoContent}
}

func (v *vmm) stopGuest() {
	if v.guest != nil {
		v.guest.stop()
		v.guest = nil
	}
}

// errorChain is the real VMM's error answer: a JSON array of strings,
// outermost error first.
func errorChain(status int, chain ...string) fdhttp.Response {
	return fdhttp.Response{Status: status, Body: chain}
}

func closeAll(files []*os.File) {
	var errs []error
	for _, f := range files {
		errs = append(errs, f.Close())
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "fakech: close descriptors: %v\n", err)
	}
}
