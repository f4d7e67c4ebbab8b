// Package qmp is a minimal client for the QEMU Machine Protocol: it reads
// the greeting, negotiates capabilities and runs commands one at a time.
//
// The QEMU process it talks to runs an untrusted guest, so everything read
// from the socket is treated as hostile: lines are bounded, replies must
// carry the id of the command they answer, and every call has a deadline.
package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// MaxLine bounds one message from QEMU. Replies to the commands we send are
// a few hundred bytes; the largest legitimate lines (the greeting, events)
// stay far below this.
const MaxLine = 64 << 10

// CallTimeout bounds a command whose ctx has no earlier deadline. A QEMU
// that does not answer on a local socket within this time is broken.
const CallTimeout = 5 * time.Second

// GreetingTimeout bounds the wait for the greeting when ctx has no earlier
// deadline. It is longer than CallTimeout: QEMU greets only after loading
// the kernel and initrd, which a loaded host may take a while to do.
const GreetingTimeout = 30 * time.Second

// Error is an error reply from QEMU.
type Error struct {
	Command string
	Class   string
	Desc    string
}

func (e *Error) Error() string {
	// Class and Desc come from QEMU: quote them so that control characters
	// cannot forge log lines.
	return fmt.Sprintf("qmp: %s: %q: %q", e.Command, e.Class, e.Desc)
}

// Client is one QMP session. Its methods must not be called concurrently.
type Client struct {
	conn   net.Conn
	r      *bufio.Reader
	nextID uint64
}

// Dial connects to the QMP Unix socket at path, reads the greeting and
// negotiates capabilities. It does not retry: a socket that is not there
// yet is the caller's to wait for.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial: %w", err)
	}
	c, err := Handshake(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// Handshake starts a session on conn, which the Client then owns: it reads
// QEMU's greeting and sends qmp_capabilities.
func Handshake(ctx context.Context, conn net.Conn) (*Client, error) {
	c := &Client{conn: conn, r: bufio.NewReaderSize(conn, MaxLine)}
	stop := c.bound(ctx, GreetingTimeout)
	msg, err := c.readMessage()
	stop()
	if err != nil {
		return nil, fmt.Errorf("qmp: read greeting: %w", err)
	}
	if msg.QMP == nil {
		return nil, errors.New("qmp: read greeting: first message is not a QMP greeting")
	}
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		return nil, err
	}
	return c, nil
}

// Close ends the session.
func (c *Client) Close() error {
	return c.conn.Close()
}

// Status is the reply of query-status.
type Status struct {
	// Running is true while guest CPUs execute.
	Running bool `json:"running"`
	// Status names the run state ("running", "prelaunch", "paused", ...).
	Status string `json:"status"`
}

// QueryStatus asks whether the VM is running.
func (c *Client) QueryStatus(ctx context.Context) (Status, error) {
	var s Status
	err := c.Execute(ctx, "query-status", nil, &s)
	return s, err
}

// Cont starts the guest CPUs of a VM launched with -S.
func (c *Client) Cont(ctx context.Context) error {
	return c.Execute(ctx, "cont", nil, nil)
}

// Stop pauses the guest CPUs.
func (c *Client) Stop(ctx context.Context) error {
	return c.Execute(ctx, "stop", nil, nil)
}

// GetFD hands f to QEMU under name, for commands that take "fd:name" (such
// as migrate). QEMU gets its own duplicate; the caller keeps f.
func (c *Client) GetFD(ctx context.Context, name string, f *os.File) error {
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("qmp: getfd: descriptors need a Unix socket, not %T", c.conn)
	}
	return c.execute(ctx, "getfd", map[string]string{"fdname": name}, nil, func(line []byte) error {
		rights := unix.UnixRights(int(f.Fd()))
		n, oobn, err := uc.WriteMsgUnix(line, rights, nil)
		runtime.KeepAlive(f)
		if err == nil && (n != len(line) || oobn != len(rights)) {
			err = fmt.Errorf("short write (%d of %d bytes)", n, len(line))
		}
		return err
	})
}

// SetMigrationCapability turns one migration capability on or off.
func (c *Client) SetMigrationCapability(ctx context.Context, capability string, on bool) error {
	type state struct {
		Capability string `json:"capability"`
		State      bool   `json:"state"`
	}
	args := map[string][]state{"capabilities": {{capability, on}}}
	return c.Execute(ctx, "migrate-set-capabilities", args, nil)
}

// Migration is the part of query-migrate's reply the driver reads.
type Migration struct {
	// Status is "setup", "active", "completed", "failed", ... or "" before
	// any migration.
	Status string `json:"status"`
	// ErrorDesc says why a migration failed.
	ErrorDesc string `json:"error-desc"`
}

// QueryMigrate reports the state of the current or last migration.
func (c *Client) QueryMigrate(ctx context.Context) (Migration, error) {
	var m Migration
	err := c.Execute(ctx, "query-migrate", nil, &m)
	return m, err
}

// Chardev is one entry of query-chardev's reply.
type Chardev struct {
	Label string `json:"label"`
	// FrontendOpen is whether the device behind the chardev has it open:
	// for a virtio-serial port, whether the guest opened the port.
	FrontendOpen bool `json:"frontend-open"`
}

// QueryChardevs lists the character devices.
func (c *Client) QueryChardevs(ctx context.Context) ([]Chardev, error) {
	var cs []Chardev
	err := c.Execute(ctx, "query-chardev", nil, &cs)
	return cs, err
}

// command is one request on the wire.
type command struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
	ID        string `json:"id"`
}

// message is any line QEMU sends: a greeting, an event or a reply.
type message struct {
	QMP    json.RawMessage `json:"QMP"`
	Event  string          `json:"event"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	ID json.RawMessage `json:"id"`
}

// Execute runs one command with optional arguments and decodes the reply's
// "return" value into result unless result is nil. Events that arrive
// before the reply are skipped.
func (c *Client) Execute(ctx context.Context, name string, args, result any) error {
	return c.execute(ctx, name, args, result, func(line []byte) error {
		_, err := c.conn.Write(line)
		return err
	})
}

// execute sends the command line with send and reads the reply.
func (c *Client) execute(ctx context.Context, name string, args, result any, send func(line []byte) error) error {
	c.nextID++
	id := strconv.FormatUint(c.nextID, 10)
	line, err := json.Marshal(command{Execute: name, Arguments: args, ID: id})
	if err != nil {
		return fmt.Errorf("qmp: %s: encode: %w", name, err)
	}
	stop := c.bound(ctx, CallTimeout)
	defer stop()
	if err := send(append(line, '\n')); err != nil {
		return fmt.Errorf("qmp: %s: send: %w", name, ctxErr(ctx, err))
	}
	wantID, _ := json.Marshal(id)
	for {
		msg, err := c.readMessage()
		if err != nil {
			return fmt.Errorf("qmp: %s: %w", name, ctxErr(ctx, err))
		}
		if msg.Event != "" {
			continue
		}
		if !bytes.Equal(msg.ID, wantID) {
			return fmt.Errorf("qmp: %s: reply for id %.40q, want %q", name, msg.ID, id)
		}
		if msg.Error != nil {
			return &Error{Command: name, Class: msg.Error.Class, Desc: msg.Error.Desc}
		}
		if msg.Return == nil {
			return fmt.Errorf("qmp: %s: reply has neither return nor error", name)
		}
		if result == nil {
			return nil
		}
		if err := json.Unmarshal(msg.Return, result); err != nil {
			return fmt.Errorf("qmp: %s: decode reply: %w", name, err)
		}
		return nil
	}
}

// bound applies ctx's deadline (or timeout from now, whichever is
// earlier) to the connection and unblocks I/O when ctx is cancelled. The
// returned func undoes it.
func (c *Client) bound(ctx context.Context, timeout time.Duration) (stop func()) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.conn.SetDeadline(deadline)
	var once sync.Once
	unregister := context.AfterFunc(ctx, func() {
		once.Do(func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	})
	return func() {
		unregister()
		once.Do(func() {})
	}
}

// readMessage reads one line of at most MaxLine bytes and decodes it.
func (c *Client) readMessage() (message, error) {
	line, err := c.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return message{}, fmt.Errorf("line longer than %d bytes", MaxLine)
	}
	if err != nil {
		return message{}, fmt.Errorf("read: %w", err)
	}
	var msg message
	if err := json.Unmarshal(line, &msg); err != nil {
		return message{}, fmt.Errorf("decode: %w", err)
	}
	return msg, nil
}

// ctxErr prefers ctx's error over the I/O error that the cancellation
// caused, so callers can tell a cancelled call from a broken QEMU.
func ctxErr(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%w (%v)", ctxErr, err)
	}
	// The socket deadline set from ctx's can fire before ctx notices.
	if d, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(d) {
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return err
}
