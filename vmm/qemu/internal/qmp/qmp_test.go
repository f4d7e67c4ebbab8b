package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const greeting = `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": "Debian"}, "capabilities": ["oob"]}}` + "\r\n"

// fakeQEMU answers each command read from conn with reply(execute, id),
// which returns the raw lines to send back.
func fakeQEMU(t *testing.T, conn net.Conn, first string, reply func(execute, id string) string) {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { conn.Close(); <-done })
	go func() {
		defer close(done)
		if _, err := io.WriteString(conn, first); err != nil {
			return
		}
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			var cmd struct {
				Execute string `json:"execute"`
				ID      string `json:"id"`
			}
			if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
				t.Errorf("fake qemu: client sent invalid JSON %q: %v", sc.Text(), err)
				return
			}
			if _, err := io.WriteString(conn, reply(cmd.Execute, cmd.ID)); err != nil {
				return
			}
		}
	}()
}

func okReply(id string) string { return `{"return": {}, "id": "` + id + `"}` + "\r\n" }

// statusReplies are replies to query-status, %ID% standing for the id of
// the command; FuzzSession starts from them.
var statusReplies = []struct {
	name        string
	status      string // the query-status reply, %ID% replaced by the id
	wantRunning bool
	wantState   string
	wantErr     string
}{
	{
		name:        "running",
		status:      `{"return": {"status": "running", "singlestep": false, "running": true}, "id": "%ID%"}`,
		wantRunning: true, wantState: "running",
	},
	{
		name:      "paused by -S",
		status:    `{"return": {"status": "prelaunch", "singlestep": false, "running": false}, "id": "%ID%"}`,
		wantState: "prelaunch",
	},
	{
		// Events may arrive at any time; they are not the reply.
		name: "events before the reply",
		status: `{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RESUME"}` + "\r\n" +
			`{"timestamp": {"seconds": 1, "microseconds": 3}, "event": "NIC_RX_FILTER_CHANGED", "data": {"path": "/x"}}` + "\r\n" +
			`{"return": {"status": "running", "running": true}, "id": "%ID%"}`,
		wantRunning: true, wantState: "running",
	},
	{
		name:    "error reply",
		status:  `{"error": {"class": "GenericError", "desc": "no\nway"}, "id": "%ID%"}`,
		wantErr: `"GenericError": "no\nway"`,
	},
	{
		name:    "reply to another command",
		status:  `{"return": {"status": "running", "running": true}, "id": "999"}`,
		wantErr: "reply for id",
	},
	{
		name:    "neither return nor error",
		status:  `{"id": "%ID%"}`,
		wantErr: "neither return nor error",
	},
	{
		name:    "not json",
		status:  `running, honestly`,
		wantErr: "decode",
	},
	{
		name:    "return of the wrong shape",
		status:  `{"return": {"running": "yes"}, "id": "%ID%"}`,
		wantErr: "decode reply",
	},
	{
		name:    "endless line",
		status:  `{"return": {"status": "` + strings.Repeat("r", MaxLine) + `"}, "id": "%ID%"}`,
		wantErr: "line longer than",
	},
}

func TestQueryStatus(t *testing.T) {
	for _, tt := range statusReplies {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			fakeQEMU(t, server, greeting, func(execute, id string) string {
				if execute == "query-status" {
					return strings.ReplaceAll(tt.status, "%ID%", id) + "\r\n"
				}
				return okReply(id)
			})
			ctx := context.Background()
			c, err := Handshake(ctx, client)
			if err != nil {
				t.Fatalf("Handshake: %v", err)
			}
			defer c.Close()
			got, err := c.QueryStatus(ctx)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("QueryStatus error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("QueryStatus: %v", err)
			}
			if got.Running != tt.wantRunning || got.Status != tt.wantState {
				t.Fatalf("QueryStatus = %+v, want running=%v status=%q", got, tt.wantRunning, tt.wantState)
			}
		})
	}
}

func TestErrorReplyIsTyped(t *testing.T) {
	client, server := net.Pipe()
	fakeQEMU(t, server, greeting, func(execute, id string) string {
		if execute == "cont" {
			return `{"error": {"class": "GenericError", "desc": "Guest is already running"}, "id": "` + id + `"}` + "\n"
		}
		return okReply(id)
	})
	c, err := Handshake(context.Background(), client)
	if err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	defer c.Close()
	err = c.Cont(context.Background())
	var qerr *Error
	if !errors.As(err, &qerr) {
		t.Fatalf("Cont error = %v, want a *qmp.Error", err)
	}
	if qerr.Command != "cont" || qerr.Class != "GenericError" || qerr.Desc != "Guest is already running" {
		t.Fatalf("Cont error = %+v", qerr)
	}
}

// handshakeReplies are first lines a client must refuse.
var handshakeReplies = []struct {
	name    string
	first   string
	wantErr string
}{
	{"not a greeting", `{"return": {}}` + "\n", "not a QMP greeting"},
	{"garbage", "\x00\x01\x02\n", "decode"},
	{"endless greeting", strings.Repeat("{", MaxLine+1), "line longer than"},
	{"closed before greeting", "", "EOF"},
}

func TestHandshakeRejects(t *testing.T) {
	for _, tt := range handshakeReplies {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			go func() {
				io.WriteString(server, tt.first)
				server.Close()
			}()
			_, err := Handshake(context.Background(), client)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Handshake error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// A QEMU that never answers must not hang the caller past ctx.
func TestCancelUnblocksCall(t *testing.T) {
	client, server := net.Pipe()
	fakeQEMU(t, server, greeting, func(execute, id string) string {
		if execute == "query-status" {
			return "" // never answer
		}
		return okReply(id)
	})
	c, err := Handshake(context.Background(), client)
	if err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(10 * time.Millisecond)
		cancel()
	}()
	_, err = c.QueryStatus(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("QueryStatus error = %v, want context.Canceled", err)
	}
}

func TestDeadlineUnblocksCall(t *testing.T) {
	client, server := net.Pipe()
	fakeQEMU(t, server, greeting, func(execute, id string) string {
		if execute == "cont" {
			return ""
		}
		return okReply(id)
	})
	c, err := Handshake(context.Background(), client)
	if err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := c.Cont(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Cont error = %v, want context.DeadlineExceeded", err)
	}
}

// scriptConn replays a fixed byte stream as QEMU's side of the socket and
// discards what the client writes.
type scriptConn struct {
	net.Conn
	r io.Reader
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzSession feeds arbitrary bytes to a client as everything QEMU says
// during a handshake and a status query: it must fail cleanly, never panic
// or accept a line over MaxLine.
func FuzzSession(f *testing.F) {
	// The client numbers commands from 1: qmp_capabilities, then
	// query-status as 2.
	for _, tt := range statusReplies {
		f.Add([]byte(greeting + okReply("1") + strings.ReplaceAll(tt.status, "%ID%", "2") + "\n"))
	}
	for _, tt := range handshakeReplies {
		f.Add([]byte(tt.first))
	}
	f.Add([]byte(greeting + `{"return": {}, "id": 1}` + "\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		c, err := Handshake(context.Background(), &scriptConn{r: bytes.NewReader(stream)})
		if err != nil {
			return
		}
		st, err := c.QueryStatus(context.Background())
		if err != nil {
			return
		}
		// Success needs a complete reply line within the bound.
		if !bytes.Contains(stream, []byte(`"2"`)) {
			t.Fatalf("QueryStatus = %+v from a stream that never answered id 2", st)
		}
	})
}

// GetFD delivers the very file to QEMU with the getfd command, and refuses
// a connection that cannot carry descriptors.
func TestGetFDPassesTheDescriptor(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	clientConn, err := net.FileConn(os.NewFile(uintptr(fds[0]), "client"))
	if err != nil {
		t.Fatal(err)
	}
	serverFile := os.NewFile(uintptr(fds[1]), "server")
	serverConn, err := net.FileConn(serverFile)
	serverFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	server := serverConn.(*net.UnixConn)
	defer server.Close()

	received := make(chan string, 1)
	go func() {
		defer close(received)
		io.WriteString(server, greeting)
		r := bufio.NewReader(server)
		line, _ := r.ReadString('\n') // qmp_capabilities
		server.Write([]byte(okReply(idOf(t, line))))
		buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := server.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		if len(msgs) != 1 {
			return
		}
		got, _ := unix.ParseUnixRights(&msgs[0])
		if len(got) != 1 {
			return
		}
		f := os.NewFile(uintptr(got[0]), "passed")
		data, _ := io.ReadAll(f)
		f.Close()
		received <- string(buf[:n]) + "|" + string(data)
		server.Write([]byte(okReply(idOf(t, string(buf[:n])))))
	}()

	c, err := Handshake(context.Background(), clientConn)
	if err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	defer c.Close()
	path := filepath.Join(t.TempDir(), "state")
	os.WriteFile(path, []byte("the state"), 0o600)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := c.GetFD(context.Background(), "snap", f); err != nil {
		t.Fatalf("GetFD: %v", err)
	}
	got := <-received
	if !strings.Contains(got, `"execute":"getfd"`) || !strings.Contains(got, `"fdname":"snap"`) || !strings.HasSuffix(got, "|the state") {
		t.Errorf("QEMU received %q, want getfd of snap with the file", got)
	}

	pipeClient, pipeServer := net.Pipe()
	fakeQEMU(t, pipeServer, greeting, func(_, id string) string { return okReply(id) })
	pc, err := Handshake(context.Background(), pipeClient)
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.GetFD(context.Background(), "snap", f); err == nil {
		t.Error("GetFD over a connection without descriptor passing succeeded")
	}
}

func idOf(t *testing.T, line string) string {
	var cmd struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(line), &cmd); err != nil {
		t.Errorf("fake qemu: %q: %v", line, err)
	}
	return cmd.ID
}
