// Package outputs is what a run's output files are on the host side: the
// patterns a request may name, the check of every entry the guest says
// matched them, the names the API may show, and the content type a file is
// served with. The guest's word counts for nothing here: names and sizes
// come from the VM the run's code controlled.
package outputs

import (
	"fmt"
	"net/http"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits of a request's output patterns.
const (
	MaxPatterns     = 16
	MaxPatternBytes = 255
)

// CheckPattern returns "" when p is an output pattern a run may name, else
// what is wrong with it. A pattern is a clean path relative to the scratch
// directory whose elements use path.Match syntax: "*" and "?" match within
// one element, never across "/", and "**" is refused rather than silently
// meaning "*".
func CheckPattern(p string) string {
	switch {
	case p == "" || len(p) > MaxPatternBytes:
		return fmt.Sprintf("pattern must be 1 to %d bytes", MaxPatternBytes)
	case !utf8.ValidString(p) || strings.ContainsAny(p, "\x00\\"):
		return "pattern must be valid UTF-8 without NUL or backslash"
	case strings.HasPrefix(p, "/"):
		return "pattern must be relative to the run's scratch directory"
	case path.Clean(p) != p || p == ".":
		return "pattern must be clean (no empty, '.' or trailing elements)"
	case p == ".." || strings.HasPrefix(p, "../") || strings.Contains(p, "/../"):
		return "pattern must not contain '..'"
	case strings.Contains(p, "**"):
		return `"**" is not supported: "*" matches within one path element (name each level, e.g. "out/*/*.csv")`
	}
	for _, r := range p {
		if unicode.IsControl(r) {
			return "pattern must not contain control characters"
		}
	}
	if _, err := path.Match(p, ""); err != nil {
		return "pattern is not valid glob syntax (see Go's path.Match): " + err.Error()
	}
	return ""
}

// Match reports how name, as the guest listed it for pattern, relates to
// it: the whole pattern matches (full), or name is a directory on the way
// whose elements match the pattern's first ones (onTheWay). Anything else
// is an entry the pattern never asked for.
func Match(pattern, name string) (full, onTheWay bool) {
	pe, ne := strings.Split(pattern, "/"), strings.Split(name, "/")
	if len(ne) > len(pe) {
		return false, false
	}
	for i, e := range ne {
		if ok, err := path.Match(pe[i], e); !ok || err != nil {
			return false, false
		}
	}
	return len(ne) == len(pe), len(ne) < len(pe)
}

// CheckName returns "" when name can be shown and served as an output
// path: valid UTF-8 without control characters, clean and relative. What
// is wrong is said without quoting the name.
func CheckName(name string) string {
	switch {
	case !utf8.ValidString(name):
		return "the name is not valid UTF-8"
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return "the name holds control characters"
	case name == "" || path.IsAbs(name) || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../"):
		return "the name is not a clean relative path"
	}
	return ""
}

// Printable renders a name that failed CheckName for a timeline entry:
// quoted, every invalid byte and control character escaped.
func Printable(name string) string { return fmt.Sprintf("%+q", name) }

// types maps extensions to the types files are served with. Text types
// get a charset when the content is valid UTF-8.
var types = map[string]string{
	".md": "text/markdown", ".markdown": "text/markdown", ".txt": "text/plain", ".log": "text/plain",
	".csv": "text/csv", ".tsv": "text/tab-separated-values", ".html": "text/html", ".htm": "text/html",
	".css": "text/css", ".js": "text/javascript", ".py": "text/x-python", ".sh": "text/x-shellscript",
	".json": "application/json", ".jsonl": "application/x-ndjson", ".ndjson": "application/x-ndjson",
	".xml": "application/xml", ".yaml": "application/yaml", ".yml": "application/yaml",
	".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
	".gif": "image/gif", ".webp": "image/webp", ".pdf": "application/pdf", ".zip": "application/zip",
	".gz": "application/gzip", ".tar": "application/x-tar",
}

// ContentType is the type a file named name holding data is served with:
// from its extension where it has a known one (text types with "charset=
// utf-8" when data is valid UTF-8), else sniffed from its first bytes.
func ContentType(name string, data []byte) string {
	t, ok := types[strings.ToLower(path.Ext(name))]
	if !ok {
		return http.DetectContentType(data)
	}
	if strings.HasPrefix(t, "text/") && utf8.Valid(data) {
		t += "; charset=utf-8"
	}
	return t
}
