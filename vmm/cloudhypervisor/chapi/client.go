// Package chapi is a client for Cloud Hypervisor's REST API, served on the
// Unix socket named by `cloud-hypervisor --api-socket path=...` under
// http://localhost/api/v1. It covers the VM lifecycle Ephemeral uses
// (create, boot, info, pause, resume, snapshot, restore, shutdown, delete,
// shutdown-vmm) and hot-adding a network device whose tap is passed as a
// file descriptor.
//
// Every call opens its own connection and is bounded by a short timeout on
// top of its context, so a wedged VMM cannot stall the caller. Errors start
// with the endpoint's name ("vm.boot: ..."); a VMM's refusal is an
// *APIError carrying its error chain.
package chapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// DefaultCallTimeout bounds one API call when the Client sets none.
const DefaultCallTimeout = 5 * time.Second

// maxResponseBody bounds what is read of one response; vm.info of a large
// VM is a few KiB.
const maxResponseBody = 1 << 20

// Client talks to one VMM's API socket.
type Client struct {
	socketPath string
	// CallTimeout bounds each call; zero means DefaultCallTimeout.
	CallTimeout time.Duration
}

// NewClient returns a client for the API socket at socketPath.
func NewClient(socketPath string) *Client {
	return &Client{socketPath: socketPath}
}

// Ping asks the VMM for its version; it answers as soon as the API server
// is up, before any VM exists.
func (c *Client) Ping(ctx context.Context) (PingResponse, error) {
	var pong PingResponse
	_, err := c.call(ctx, http.MethodGet, "vmm.ping", nil, nil, &pong)
	return pong, err
}

// Create defines the VM without booting it.
func (c *Client) Create(ctx context.Context, cfg VMConfig) error {
	_, err := c.call(ctx, http.MethodPut, "vm.create", cfg, nil, nil)
	return err
}

// Boot starts the created VM.
func (c *Client) Boot(ctx context.Context) error {
	_, err := c.call(ctx, http.MethodPut, "vm.boot", nil, nil, nil)
	return err
}

// Info reports the VM's configuration and state.
func (c *Client) Info(ctx context.Context) (VMInfo, error) {
	var raw json.RawMessage
	if _, err := c.call(ctx, http.MethodGet, "vm.info", nil, nil, &raw); err != nil {
		return VMInfo{}, err
	}
	info, err := parseInfo(raw)
	if err != nil {
		return VMInfo{}, fmt.Errorf("vm.info: %w", err)
	}
	return info, nil
}

// Shutdown stops the VM; the VMM process keeps running.
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.call(ctx, http.MethodPut, "vm.shutdown", nil, nil, nil)
	return err
}

// Delete removes the VM definition.
func (c *Client) Delete(ctx context.Context) error {
	_, err := c.call(ctx, http.MethodPut, "vm.delete", nil, nil, nil)
	return err
}

// Pause stops the vCPUs of a running VM.
func (c *Client) Pause(ctx context.Context) error {
	_, err := c.call(ctx, http.MethodPut, "vm.pause", nil, nil, nil)
	return err
}

// Resume restarts a paused VM.
func (c *Client) Resume(ctx context.Context) error {
	_, err := c.call(ctx, http.MethodPut, "vm.resume", nil, nil, nil)
	return err
}

// Snapshot writes the paused VM's state to destinationURL, a directory as
// "file:///path".
func (c *Client) Snapshot(ctx context.Context, destinationURL string) error {
	body := struct {
		DestinationURL string `json:"destination_url"`
	}{destinationURL}
	_, err := c.call(ctx, http.MethodPut, "vm.snapshot", body, nil, nil)
	return err
}

// Restore creates the VM from a snapshot, in a VMM that has none yet.
// taps are the net devices' new tap queues, in the order cfg.NetFDs
// counts them; they travel as SCM_RIGHTS, the caller keeps its files.
func (c *Client) Restore(ctx context.Context, cfg RestoreConfig, taps ...*os.File) error {
	want := 0
	for _, n := range cfg.NetFDs {
		want += n.NumFDs
	}
	if want != len(taps) {
		return fmt.Errorf("vm.restore: net_fds count %d descriptors, %d given", want, len(taps))
	}
	_, err := c.call(ctx, http.MethodPut, "vm.restore", cfg, taps, nil)
	return err
}

// ShutdownVMM makes the VMM process exit.
func (c *Client) ShutdownVMM(ctx context.Context) error {
	_, err := c.call(ctx, http.MethodPut, "vmm.shutdown", nil, nil, nil)
	return err
}

// AddNet adds a virtio-net device backed by the given open tap queues.
// The descriptors travel as SCM_RIGHTS with the request; the VMM gets its
// own duplicates and the caller keeps the files. vm.create ignores
// descriptors (Cloud Hypervisor v53 drops them there), so a tap passed by
// descriptor is added to a created VM with this call before boot; that
// cold-add returns no device info (nil). On a running VM the device is
// hot-plugged and its PCI address is returned.
func (c *Client) AddNet(ctx context.Context, cfg Net, taps ...*os.File) (*PCIDeviceInfo, error) {
	var dev PCIDeviceInfo
	status, err := c.call(ctx, http.MethodPut, "vm.add-net", cfg, taps, &dev)
	if err != nil || status == http.StatusNoContent {
		return nil, err
	}
	return &dev, nil
}

// call performs one request: body (if not nil) is sent as JSON, files are
// attached as SCM_RIGHTS, and a 200 answer is decoded into out (if not nil).
// It returns the status code of a successful answer.
func (c *Client) call(ctx context.Context, method, op string, body any, files []*os.File, out any) (int, error) {
	status, err := c.roundTrip(ctx, method, op, body, files, out)
	if err != nil {
		var apiErr *APIError
		if errors.As(err, &apiErr) {
			return 0, err
		}
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	return status, nil
}

func (c *Client) roundTrip(ctx context.Context, method, op string, body any, files []*os.File, out any) (int, error) {
	timeout := c.CallTimeout
	if timeout <= 0 {
		timeout = DefaultCallTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	req, wire, err := encodeRequest(method, op, body)
	if err != nil {
		return 0, err
	}
	var dialer net.Dialer
	nc, err := dialer.DialContext(ctx, "unix", c.socketPath)
	if err != nil {
		return 0, fmt.Errorf("dial API socket: %w", err)
	}
	conn := nc.(*net.UnixConn)
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return 0, fmt.Errorf("set deadline: %w", err)
	}
	// Cancellation without a deadline must interrupt a blocked read too.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	status, respBody, err := exchange(conn, req, wire, files)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The socket's deadline is ctx's, which may trail it by a
			// tick: wait for it to report why (timeout or cancel).
			<-ctx.Done()
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("no answer: %w", ctx.Err())
		}
		return 0, err
	}
	switch {
	case status < 200 || status > 299:
		return 0, &APIError{Operation: op, StatusCode: status, Messages: parseErrorBody(respBody)}
	case status == http.StatusOK && out != nil:
		if err := json.Unmarshal(respBody, out); err != nil {
			return 0, fmt.Errorf("decode response: %w", err)
		}
	}
	return status, nil
}

// encodeRequest renders the request as it goes on the wire, so that it can
// be written with one sendmsg together with the descriptors.
func encodeRequest(method, op string, body any) (*http.Request, []byte, error) {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, nil, fmt.Errorf("encode request: %w", err)
		}
		payload = b
	}
	req, err := http.NewRequest(method, "http://localhost/api/v1/"+op, bytes.NewReader(payload))
	if err != nil {
		return nil, nil, fmt.Errorf("build request: %w", err)
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	var wire bytes.Buffer
	if err := req.Write(&wire); err != nil {
		return nil, nil, fmt.Errorf("encode request: %w", err)
	}
	return req, wire.Bytes(), nil
}

// exchange writes the request and reads the answer on conn.
func exchange(conn *net.UnixConn, req *http.Request, wire []byte, files []*os.File) (int, []byte, error) {
	if err := writeWithFiles(conn, wire, files); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, nil, fmt.Errorf("read response: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return 0, nil, fmt.Errorf("read response body: %w", err)
	}
	if len(body) > maxResponseBody {
		return 0, nil, fmt.Errorf("response body larger than %d bytes", maxResponseBody)
	}
	return resp.StatusCode, body, nil
}
