package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// mount is a cgroup filesystem as /proc/self/mountinfo shows it.
type mount struct {
	// point is where it is mounted.
	point string
	// root is the group of the hierarchy that point shows: "/" unless
	// the mount shows a subtree (as bind mounts into containers do).
	root string
	// v2 is the unified hierarchy (fstype cgroup2).
	v2 bool
	// options are a v1 mount's super options: its controllers among
	// them ("rw,cpu,cpuacct").
	options []string
}

// has reports whether a v1 mount holds controller.
func (m mount) has(controller string) bool {
	for _, o := range m.options {
		if o == controller {
			return true
		}
	}
	return false
}

// parseMountinfo returns the cgroup and cgroup2 mounts in the text of
// /proc/self/mountinfo, whose lines read
// "ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPEROPTIONS".
func parseMountinfo(data []byte) ([]mount, error) {
	var mounts []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(fields) < sep+4 {
			return nil, fmt.Errorf("mountinfo line %q: want ROOT POINT ... - FSTYPE SOURCE OPTIONS", sc.Text())
		}
		fstype := fields[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		mounts = append(mounts, mount{
			point:   unescapeMountPath(fields[4]),
			root:    unescapeMountPath(fields[3]),
			v2:      fstype == "cgroup2",
			options: strings.Split(fields[sep+3], ","),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	return mounts, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 is a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownGroups parses /proc/self/cgroup, whose lines read
// "ID:CONTROLLERS:PATH": it maps each v1 controller to the group this
// process is in, and "" to its v2 group (the line "0::PATH").
func ownGroups(data []byte) (map[string]string, error) {
	groups := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			return nil, fmt.Errorf("/proc/self/cgroup line %q: want ID:CONTROLLERS:/PATH", line)
		}
		if parts[0] == "0" && parts[1] == "" {
			groups[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c != "" {
				groups[c] = parts[2]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/proc/self/cgroup: %w", err)
	}
	return groups, nil
}

// groupDir is the directory of group (a path in m's hierarchy) below m's
// mount point.
func groupDir(m mount, group string) (string, error) {
	group, root := path.Clean(group), path.Clean(m.root)
	rel := group
	if root != "/" {
		var ok bool
		if rel, ok = strings.CutPrefix(group, root); !ok || (rel != "" && rel[0] != '/') {
			return "", fmt.Errorf("this process's group %s is outside what %s shows (%s)", group, m.point, root)
		}
	}
	return filepath.Join(m.point, rel), nil
}
