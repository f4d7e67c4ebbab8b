package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/ephemeralhq/ephemeral/hostd/outputs"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// Output collection: when the run ends, before its VM is destroyed, the
// files matching the run's output patterns are copied out. The guest lists
// and reads (following no symlink, as the worker); the host trusts none of
// it: every entry must match its pattern and have a name the API can show,
// and the bytes are counted here against the caps, whatever size the guest
// stated.

// Defaults of the output caps in Config.
const (
	DefaultMaxOutputFileBytes = 10 << 20
	DefaultMaxOutputBytes     = 50 << 20
)

const (
	// maxOutputEntries bounds the guest's listing of one run.
	maxOutputEntries = 1000
	// collectTimeout bounds the copying after the run's own end (its
	// context may have ended: a timeout's outputs are worth having).
	collectTimeout = 30 * time.Second
)

// outputCollector copies one run's outputs.
type outputCollector struct {
	vm       VM
	rec      *runs.Recorder
	patterns []string
	fileCap  int64
	runCap   int64
	total    int64           // bytes kept so far
	seen     map[string]bool // paths already handled (two patterns may match one file)
}

func (e *Executor) collectOutputs(ctx context.Context, vm VM, spec runs.Spec, rec *runs.Recorder) error {
	if len(spec.Outputs) == 0 {
		return nil
	}
	select {
	case <-vm.Done():
		return rec.Event(timeline.Output, "outputs not copied: the microVM had stopped", nil)
	default:
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), collectTimeout)
	defer cancel()
	c := &outputCollector{vm: vm, rec: rec, patterns: spec.Outputs, fileCap: e.cfg.MaxOutputFileBytes, runCap: e.cfg.MaxOutputBytes,
		seen: map[string]bool{}}
	return c.collect(ctx)
}

func (c *outputCollector) collect(ctx context.Context) error {
	listing, err := c.vm.ListOutputs(ctx, vsockproto.OutputsRequest{Patterns: c.patterns, MaxEntries: maxOutputEntries})
	if err != nil {
		return c.rec.ContentEvent(timeline.Output, "outputs could not be listed: "+guestText(err.Error()), nil)
	}
	matched := make([]bool, len(c.patterns))
	for i, entry := range listing.Entries {
		if ctx.Err() != nil {
			return c.rec.Event(timeline.Output, fmt.Sprintf("outputs: copying stopped after %v; %d listed entries not copied",
				collectTimeout, len(listing.Entries)-i), map[string]any{"not_copied": len(listing.Entries) - i})
		}
		if entry.Pattern < 0 || entry.Pattern >= len(c.patterns) {
			continue // the decoder refuses these; never index with the guest's number unchecked
		}
		matched[entry.Pattern] = true
		if err := c.handle(ctx, c.patterns[entry.Pattern], entry); err != nil {
			return err
		}
	}
	for i, p := range c.patterns {
		if !matched[i] {
			if err := c.rec.ContentEvent(timeline.Output, timeline.OutputUnmatched(p), map[string]any{"pattern": p, "matched": false}); err != nil {
				return err
			}
		}
	}
	if listing.Truncated {
		return c.rec.Event(timeline.Output, timeline.OutputsTruncated(maxOutputEntries), map[string]any{"truncated": true})
	}
	return nil
}

// handle decides about one listed entry: keep it or say why not.
func (c *outputCollector) handle(ctx context.Context, pattern string, e vsockproto.OutputEntry) error {
	if msg := outputs.CheckName(e.Path); msg != "" {
		return c.skip(outputs.Printable(e.Path), msg, 0)
	}
	full, onTheWay := outputs.Match(pattern, e.Path)
	if !full && !(onTheWay && (e.Kind == vsockproto.OutputSymlink || e.Kind == vsockproto.OutputError)) {
		return c.skip(e.Path, "listed by the guest, but "+pattern+" does not match it", 0)
	}
	if c.seen[e.Path] {
		return nil
	}
	c.seen[e.Path] = true
	switch e.Kind {
	case vsockproto.OutputDir:
		return c.skip(e.Path, "a directory (name the files in it, e.g. "+e.Path+"/*)", 0)
	case vsockproto.OutputSymlink:
		return c.skip(e.Path, "a symbolic link (links are not followed)", 0)
	case vsockproto.OutputOther:
		return c.skip(e.Path, "not a regular file", 0)
	case vsockproto.OutputError:
		return c.skip(e.Path, "could not be read: "+guestText(e.Error), 0)
	}
	if e.Size > c.fileCap {
		return c.skip(e.Path, timeline.OverFileCap(e.Size, c.fileCap), e.Size)
	}
	left := c.runCap - c.total
	if e.Size > left {
		return c.skip(e.Path, timeline.OverRunCap(e.Size, c.runCap), e.Size)
	}
	limit := min(c.fileCap, left)
	buf := &cappedBuffer{max: limit}
	err := c.vm.ReadOutput(ctx, vsockproto.FileRequest{Path: e.Path, MaxBytes: limit}, buf)
	switch {
	case errors.Is(err, errOutputTooLarge):
		return c.skip(e.Path, timeline.GrewPastCap(limit), limit)
	case err != nil:
		return c.skip(e.Path, "could not be copied: "+guestText(err.Error()), 0)
	}
	data := buf.Bytes()
	c.total += int64(len(data))
	if err := c.rec.Output(e.Path, data); errors.Is(err, runs.ErrOutputNotKept) {
		return c.skip(e.Path, err.Error(), int64(len(data)))
	} else if err != nil {
		return err
	}
	return c.rec.ContentEvent(timeline.Output, timeline.OutputKept(e.Path, int64(len(data))),
		map[string]any{"path": e.Path, "size": len(data), "kept": true})
}

func (c *outputCollector) skip(path, why string, size int64) error {
	return c.rec.ContentEvent(timeline.Output, timeline.OutputSkipped(path, why),
		map[string]any{"path": path, "reason": why, "size": size, "kept": false})
}

// errOutputTooLarge stops a copy at its cap.
var errOutputTooLarge = errors.New("output larger than its cap")

// cappedBuffer keeps at most max bytes and fails the write that would
// pass them: the guest's stated size is never what the host relies on.
// Write is its only way in (an embedded bytes.Buffer would also offer
// WriteString and ReadFrom, which know no cap).
type cappedBuffer struct {
	buf bytes.Buffer
	max int64
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if int64(b.buf.Len())+int64(len(p)) > b.max {
		return 0, errOutputTooLarge
	}
	return b.buf.Write(p)
}

func (b *cappedBuffer) Bytes() []byte { return b.buf.Bytes() }

// guestText makes text that came from the guest fit for a timeline
// entry: valid UTF-8, no control characters, short.
func guestText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	const max = 300
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "…"
	}
	return s
}
