// Package fdhttp is a minimal HTTP/1.1 server on a Unix socket that also
// receives the file descriptors a client passes as SCM_RIGHTS ancillary data,
// the way Cloud Hypervisor's API server does. net/http cannot see ancillary
// data, so stand-ins for the VMM (the fake binary, the client's contract
// test) serve with this instead.
package fdhttp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// maxBody bounds a request body; Cloud Hypervisor's own limit is far
// smaller, so anything above is a broken client.
const maxBody = 1 << 20

// maxFDsPerRead is the most descriptors one read accepts (the kernel's
// SCM_MAX_FD).
const maxFDsPerRead = 253

// Request is one request as the server read it.
type Request struct {
	*http.Request
	Body []byte
	// Files are the descriptors that arrived with the request's bytes, in
	// the order sent. The handler owns them.
	Files []*os.File
}

// Response is what a handler answers. A nil Body sends no body.
type Response struct {
	Status int
	Body   any
	// After, if set, runs once the response has been written.
	After func()
}

// Handler answers one request.
type Handler func(ctx context.Context, req *Request) Response

// Serve accepts connections on ln until ctx ends, answering each request with
// h. It closes ln and returns once every connection has finished.
func Serve(ctx context.Context, ln *net.UnixListener, h Handler) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var (
		mu    sync.Mutex
		conns = map[*net.UnixConn]struct{}{}
	)
	// Open connections must not outlive Serve: closing them on ctx end
	// unblocks their readers.
	closeConns := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	})
	defer closeConns()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("fdhttp: accept: %w", err)
		}
		mu.Lock()
		conns[conn] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				mu.Lock()
				delete(conns, conn)
				mu.Unlock()
				conn.Close()
			}()
			serveConn(ctx, conn, h)
		}()
	}
}

// serveConn answers requests on conn until the client closes it or sends
// something that is not HTTP.
func serveConn(ctx context.Context, conn *net.UnixConn, h Handler) {
	src := &fdReader{conn: conn}
	defer src.closeFiles()
	br := bufio.NewReader(src)
	for {
		hr, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(io.LimitReader(hr.Body, maxBody+1))
		if err != nil || len(body) > maxBody {
			return
		}
		req := &Request{Request: hr, Body: body, Files: src.take()}
		resp := h(ctx, req)
		err = writeResponse(conn, resp)
		if resp.After != nil {
			resp.After()
		}
		if err != nil || hr.Close {
			return
		}
	}
}

func writeResponse(w io.Writer, resp Response) error {
	var body []byte
	if resp.Body != nil {
		b, err := json.Marshal(resp.Body)
		if err != nil {
			return fmt.Errorf("fdhttp: encode response: %w", err)
		}
		body = b
	}
	head := fmt.Sprintf("HTTP/1.1 %d %s\r\nServer: fdhttp\r\n", resp.Status, http.StatusText(resp.Status))
	if len(body) > 0 {
		head += "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n"
	} else if resp.Status != http.StatusNoContent {
		head += "Content-Length: 0\r\n"
	}
	head += "\r\n"
	if _, err := io.WriteString(w, head); err != nil {
		return fmt.Errorf("fdhttp: write response: %w", err)
	}
	if _, err := w.Write(body); err != nil {
		return fmt.Errorf("fdhttp: write response: %w", err)
	}
	return nil
}

// fdReader reads a Unix stream with recvmsg, keeping the descriptors that
// arrive until the request they came with has been parsed.
type fdReader struct {
	conn  *net.UnixConn
	files []*os.File
}

func (r *fdReader) Read(p []byte) (int, error) {
	oob := make([]byte, unix.CmsgSpace(maxFDsPerRead*4))
	n, oobn, _, _, err := r.conn.ReadMsgUnix(p, oob)
	n, oobn = max(n, 0), max(oobn, 0) // a failed read reports -1
	if oobn > 0 {
		if perr := r.keepFDs(oob[:oobn]); perr != nil && err == nil {
			err = perr
		}
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

func (r *fdReader) keepFDs(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("fdhttp: parse control message: %w", err)
	}
	var errs []error
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			errs = append(errs, fmt.Errorf("fdhttp: parse SCM_RIGHTS: %w", err))
			continue
		}
		for _, fd := range fds {
			r.files = append(r.files, os.NewFile(uintptr(fd), "scm-rights-"+strconv.Itoa(fd)))
		}
	}
	return errors.Join(errs...)
}

// take hands the descriptors received so far to the caller.
func (r *fdReader) take() []*os.File {
	files := r.files
	r.files = nil
	return files
}

func (r *fdReader) closeFiles() {
	for _, f := range r.take() {
		f.Close()
	}
}
