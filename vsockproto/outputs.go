package vsockproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// A list_outputs stream carries the listing as JSON lines on stdout: one
// listingLine each, the truncation mark (if any) last. Lines and the whole
// listing are bounded, so a hostile guest cannot make the host buffer more
// than maxListingBytes.
type listingLine struct {
	Entry     *OutputEntry `json:"entry,omitempty"`
	Truncated bool         `json:"truncated,omitempty"`
}

const (
	// maxListingLine bounds one encoded line: a path of PATH_MAX bytes,
	// every one escaped, and a short error.
	maxListingLine = 32 << 10
	// maxListingBytes bounds a whole listing; the guest stops before it.
	maxListingBytes = 8 << 20
	// maxEntryError bounds the error text of an entry.
	maxEntryError = 256
)

var outputKinds = map[string]bool{OutputFile: true, OutputDir: true, OutputSymlink: true, OutputOther: true, OutputError: true}

// encodeListing writes l as the guest sends it, stopping (and marking the
// listing truncated) before it would pass maxListingBytes.
func encodeListing(l OutputListing) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	truncated := l.Truncated
	for _, e := range l.Entries {
		if len(e.Error) > maxEntryError {
			e.Error = e.Error[:maxEntryError]
		}
		before := buf.Len()
		enc.Encode(listingLine{Entry: &e}) // strings and numbers: cannot fail
		if buf.Len()-before > maxListingLine || buf.Len() > maxListingBytes-64 {
			buf.Truncate(before)
			truncated = true
			break
		}
	}
	if truncated {
		enc.Encode(listingLine{Truncated: true})
	}
	return buf.Bytes()
}

// decodeListing parses what a guest sent for a request with patterns
// patterns and at most maxEntries entries. Anything off the format is a
// protocol violation.
func decodeListing(data []byte, patterns, maxEntries int) (OutputListing, error) {
	var l OutputListing
	if len(data) > maxListingBytes {
		return l, protocolErrorf("output listing of %d bytes exceeds %d", len(data), maxListingBytes)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		return l, protocolErrorf("output listing does not end with a newline")
	}
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		line := data[:i]
		data = data[i+1:]
		if len(line) > maxListingLine {
			return l, protocolErrorf("output listing line of %d bytes exceeds %d", len(line), maxListingLine)
		}
		if l.Truncated {
			return l, protocolErrorf("output listing continues after its truncation mark")
		}
		var ll listingLine
		if err := decodeStrict(line, &ll); err != nil {
			return l, protocolErrorf("output listing line: %v", err)
		}
		switch e := ll.Entry; {
		case ll.Truncated && e == nil:
			l.Truncated = true
		case ll.Truncated || e == nil:
			return l, protocolErrorf("output listing line must hold an entry or the truncation mark")
		case len(l.Entries) >= maxEntries:
			return l, protocolErrorf("output listing has more than the %d entries asked for", maxEntries)
		case e.Pattern < 0 || e.Pattern >= patterns:
			return l, protocolErrorf("output entry for pattern %d of %d", e.Pattern, patterns)
		case !outputKinds[e.Kind]:
			return l, protocolErrorf("output entry of unknown kind %q", e.Kind)
		case e.Path == "" || e.Size < 0 || len(e.Error) > maxEntryError:
			return l, protocolErrorf("implausible output entry %+v", *e)
		default:
			l.Entries = append(l.Entries, *e)
		}
	}
	return l, nil
}

// ListOutputs asks the guest which entries under the scratch directory
// match req.Patterns. The answer is the guest's word: the host checks each
// entry against its pattern before using it.
func (c *Client) ListOutputs(ctx context.Context, req OutputsRequest) (OutputListing, error) {
	if err := req.Validate(); err != nil {
		return OutputListing{}, err
	}
	buf := &boundedBuffer{max: maxListingBytes}
	st, err := c.open(ctx, openRequest{Op: opListOutputs, Outputs: &req}, buf, nil)
	if err != nil {
		return OutputListing{}, err
	}
	if err := c.result(ctx, st); err != nil {
		return OutputListing{}, err
	}
	l, err := decodeListing(buf.Bytes(), len(req.Patterns), req.MaxEntries)
	if err != nil {
		return OutputListing{}, fmt.Errorf("vsockproto: %s: %w", opListOutputs, err)
	}
	return l, nil
}

// ReadOutput copies the regular file req.Path, relative to the scratch
// directory, from the guest to w. The guest opens it as the worker without
// following any symbolic link and refuses anything but a regular file of at
// most req.MaxBytes; w is the host's own guard of that cap, since a guest
// may send more than it said. w is not written after ReadOutput returns.
func (c *Client) ReadOutput(ctx context.Context, req FileRequest, w io.Writer) error {
	st, err := c.open(ctx, openRequest{Op: opReadOutput, File: &req}, w, nil)
	if err != nil {
		return err
	}
	return c.result(ctx, st)
}

// errListingTooLarge fails a listing past maxListingBytes.
var errListingTooLarge = errors.New("output listing too large")

// boundedBuffer keeps what is written up to max bytes and fails past it.
// Write is its only way in.
type boundedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > b.max {
		return 0, errListingTooLarge
	}
	return b.buf.Write(p)
}

func (b *boundedBuffer) Bytes() []byte { return b.buf.Bytes() }
