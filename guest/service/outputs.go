package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/ephemeralhq/ephemeral/guest/worker"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// A run's outputs are files the worker wrote, named by patterns the host
// sends when the run ends. Everything below the scratch directory is the
// worker's to shape, symlinks to /etc/shadow included, while the init runs
// as root: so the listing and every read happen with the worker's
// filesystem identity (root-only files stay unreadable) and never follow a
// symbolic link, neither the last element nor a directory on the way.
//
// The patterns are matched here rather than on the host from a full
// listing: the scratch directory may hold a million files (a node_modules),
// and only the directories the patterns lead into are read.

// ListOutputs lists the entries matching req.Patterns, each pattern's in
// path order, up to req.MaxEntries.
func (s *Service) ListOutputs(ctx context.Context, req vsockproto.OutputsRequest) (vsockproto.OutputListing, error) {
	acct, err := worker.LookupAccount(s.Runner.Root, worker.DefaultUser)
	if err != nil {
		return vsockproto.OutputListing{}, err
	}
	l := &lister{ctx: ctx, max: req.MaxEntries}
	err = withFilesystemIDs(acct.UID, acct.GID, func() error {
		root, err := unix.Open(s.Runner.ScratchDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("list outputs: open the scratch directory: %w", err)
		}
		defer unix.Close(root)
		for i, p := range req.Patterns {
			if err := l.expand(root, i, "", strings.Split(p, "/")); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, errListingFull) {
		err = nil
	}
	return l.listing, err
}

// errListingFull stops a walk at the listing's cap.
var errListingFull = errors.New("listing full")

type lister struct {
	ctx     context.Context
	max     int
	listing vsockproto.OutputListing
}

func (l *lister) add(e vsockproto.OutputEntry) error {
	if len(l.listing.Entries) >= l.max {
		l.listing.Truncated = true
		return errListingFull
	}
	l.listing.Entries = append(l.listing.Entries, e)
	return nil
}

// expand matches the pattern elements elems against the directory dir
// (whose path below the scratch directory is prefix) and what lies below it.
// A symlink or an unreadable directory on the way is listed when the
// pattern names it literally, so the host can say why nothing came of it.
func (l *lister) expand(dir, pattern int, prefix string, elems []string) error {
	if err := l.ctx.Err(); err != nil {
		return err
	}
	elem, rest := elems[0], elems[1:]
	literal := !strings.ContainsAny(elem, `*?[\`)
	names := []string{elem}
	if !literal {
		var err error
		if names, err = matchingNames(dir, elem); err != nil {
			return l.add(vsockproto.OutputEntry{Pattern: pattern, Path: displayPath(prefix, "."), Kind: vsockproto.OutputError, Error: err.Error()})
		}
	}
	for _, name := range names {
		p := path.Join(prefix, name)
		if !utf8.ValidString(p) {
			if err := l.add(vsockproto.OutputEntry{Pattern: pattern, Path: strings.ToValidUTF8(p, "\uFFFD"), Kind: vsockproto.OutputError,
				Error: "the name is not valid UTF-8"}); err != nil {
				return err
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err := l.add(vsockproto.OutputEntry{Pattern: pattern, Path: p, Kind: vsockproto.OutputError, Error: err.Error()}); err != nil {
				return err
			}
			continue
		}
		kind := entryKind(st.Mode)
		if len(rest) == 0 {
			e := vsockproto.OutputEntry{Pattern: pattern, Path: p, Kind: kind}
			if kind == vsockproto.OutputFile {
				e.Size = st.Size
			}
			if err := l.add(e); err != nil {
				return err
			}
			continue
		}
		switch {
		case kind == vsockproto.OutputDir:
			if err := l.descend(dir, name, pattern, p, rest); err != nil {
				return err
			}
		case kind == vsockproto.OutputSymlink && literal:
			if err := l.add(vsockproto.OutputEntry{Pattern: pattern, Path: p, Kind: kind}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *lister) descend(dir int, name string, pattern int, p string, rest []string) error {
	sub, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		kind := vsockproto.OutputError
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			kind = vsockproto.OutputSymlink // replaced since it was examined
		}
		return l.add(vsockproto.OutputEntry{Pattern: pattern, Path: p, Kind: kind, Error: errorText(kind, err)})
	}
	defer unix.Close(sub)
	return l.expand(sub, pattern, p, rest)
}

func errorText(kind string, err error) string {
	if kind == vsockproto.OutputError {
		return err.Error()
	}
	return ""
}

// matchingNames reads dir and returns the names that match elem, sorted.
// Only the matches are kept, so a huge directory costs time, not memory.
func matchingNames(dir int, elem string) ([]string, error) {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), ".")
	defer f.Close()
	var out []string
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			if ok, _ := path.Match(elem, n); ok {
				out = append(out, n)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(out)
	return out, nil
}

func displayPath(prefix, dflt string) string {
	if prefix == "" {
		return dflt
	}
	return prefix
}

func entryKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return vsockproto.OutputFile
	case unix.S_IFDIR:
		return vsockproto.OutputDir
	case unix.S_IFLNK:
		return vsockproto.OutputSymlink
	}
	return vsockproto.OutputOther
}

// ReadOutput copies the regular file req.Path (relative to the scratch
// directory) to w, at most req.MaxBytes of it. The file is opened as the
// worker, beneath the scratch directory and through no symbolic link; the
// copy itself, which waits for the host, runs without the worker's
// identity held on a locked thread.
func (s *Service) ReadOutput(ctx context.Context, req vsockproto.FileRequest, w io.Writer) error {
	acct, err := worker.LookupAccount(s.Runner.Root, worker.DefaultUser)
	if err != nil {
		return err
	}
	if p := req.Path; path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
		return fmt.Errorf("read output %q: the path must be clean and stay in the scratch directory", p)
	}
	var f *os.File
	err = withFilesystemIDs(acct.UID, acct.GID, func() error {
		fd, err := openBeneath(s.Runner.ScratchDir, req.Path)
		if err != nil {
			return err
		}
		f = os.NewFile(uintptr(fd), req.Path)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read output %s: %w", req.Path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read output %s: %w", req.Path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("read output %s: not a regular file (%s)", req.Path, fi.Mode().Type())
	}
	if req.MaxBytes > 0 && fi.Size() > req.MaxBytes {
		return fmt.Errorf("read output %s: %d bytes exceed the limit of %d", req.Path, fi.Size(), req.MaxBytes)
	}
	src := io.Reader(f)
	if req.MaxBytes > 0 {
		src = io.LimitReader(f, req.MaxBytes) // the file may grow while it is read
	}
	if _, err := io.Copy(w, src); err != nil {
		return fmt.Errorf("read output %s: %w", req.Path, err)
	}
	return nil
}

// errSymlink is what a read through a symbolic link fails with.
var errSymlink = errors.New("a symbolic link is in the way (links are not followed)")

// openFileFlags opens for reading without following a final symlink and
// without blocking on a FIFO (which is then refused as not regular).
const openFileFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC

// openBeneath opens rel below root following no symbolic link at all:
// openat2 with RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS where the kernel has
// it (5.6 and later), else a walk that opens one element at a time.
func openBeneath(root, rel string) (int, error) {
	rootFD, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the scratch directory: %w", err)
	}
	defer unix.Close(rootFD)
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{
		Flags:   openFileFlags,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ENOSYS):
		return openBeneathWalk(rootFD, rel)
	case errors.Is(err, unix.ELOOP):
		return -1, errSymlink
	case errors.Is(err, unix.EXDEV):
		return -1, errors.New("the path leaves the scratch directory")
	case err != nil:
		return -1, err
	}
	return fd, nil
}

// openBeneathWalk is openBeneath for kernels without openat2: each
// directory on the way is opened relative to the one before with
// O_NOFOLLOW|O_DIRECTORY, the file with O_NOFOLLOW, so no element is ever
// resolved through a symbolic link, and ".." is refused outright.
func openBeneathWalk(rootFD int, rel string) (int, error) {
	elems := strings.Split(rel, "/")
	for _, e := range elems {
		if e == "" || e == "." || e == ".." {
			return -1, errors.New("the path must be clean and stay in the scratch directory")
		}
	}
	dir, err := unix.Dup(rootFD)
	if err != nil {
		return -1, err
	}
	for _, e := range elems[:len(elems)-1] {
		next, err := unix.Openat(dir, e, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			var st unix.Stat_t
			if errors.Is(err, unix.ELOOP) || unix.Fstatat(dir, e, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = errSymlink
			}
			unix.Close(dir)
			return -1, err
		}
		unix.Close(dir)
		dir = next
	}
	defer unix.Close(dir)
	fd, err := unix.Openat(dir, elems[len(elems)-1], openFileFlags, 0)
	if errors.Is(err, unix.ELOOP) {
		return -1, errSymlink
	}
	return fd, err
}
