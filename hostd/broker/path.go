package broker

import (
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// maxSubpathBytes bounds the path of one connection request: the
// canonicaliser's work grows with it.
const maxSubpathBytes = 8 << 10

// maxDecodings is how many layers of percent-encoding (and NFKC folding)
// the canonicaliser peels looking for a dot segment or separator; a
// segment that still changes after that many is refused.
const maxDecodings = 4

// canonicalSubpath returns the one form in which the broker forwards the
// escaped path a guest or model asks for under a connection ("" or
// "/..."), or why it refuses it.
//
// Upstream servers do not agree on what a path means: Tomcat, Jetty and
// Spring drop ";params" from a segment before matching ("..;" is ".."),
// some decode twice ("%252e" is "."), some fold Unicode (NFKC turns "．．"
// and "‥" into ".."), lenient UTF-8 decoders read overlong forms ("%C0%AE"
// is "."), Windows servers trim trailing dots and spaces ("... " is ".."),
// and some treat "\" or an encoded "/" as a separator. So the broker
// never forwards what it cannot read one way only:
//
//   - Syntax it can normalise is normalised (RFC 3986 section 6.2.2):
//     encoded unreserved characters are decoded, other escapes upper-cased,
//     characters that must be escaped are escaped, reserved characters
//     ("!$&'()*+,;=:@") keep their literal or encoded form, runs of "/"
//     collapse to one.
//   - Plain "." and ".." segments (also as %2E) mean the same to every
//     server: they are resolved, and a ".." that climbs above the
//     connection's base path is refused with 403.
//   - A segment that any of the readings above turns into a dot segment or
//     splits in two, and malformed escapes, invalid UTF-8 and control
//     characters, are refused with 400: they cannot be canonicalised
//     unambiguously, so the broker does not guess.
//
// The result is what the broker forwards, so the upstream receives exactly
// the path that was checked. It is idempotent: canonicalising it again
// returns it unchanged.
func canonicalSubpath(raw string) (string, *refusal) {
	if raw == "" {
		return "", nil
	}
	switch {
	case raw[0] != '/':
		return "", refuse(http.StatusBadRequest, "path must start with /")
	case len(raw) > maxSubpathBytes:
		return "", refuse(http.StatusRequestURITooLong, "path exceeds %d bytes", maxSubpathBytes)
	case !utf8.ValidString(raw):
		return "", refuse(http.StatusBadRequest, "path is not valid UTF-8")
	}
	segments := strings.Split(raw[1:], "/")
	var kept []string
	trailingSlash := false
	for i, seg := range segments {
		last := i == len(segments)-1
		enc, dec, ref := canonicalSegment(seg)
		if ref != nil {
			return "", ref
		}
		switch dec {
		case "":
			// "//" is "/" to most servers and a network-path reference
			// to some URL parsers: collapse it, keep a trailing "/".
		case ".":
		case "..":
			if len(kept) == 0 {
				return "", refuse(http.StatusForbidden, "path climbs above the connection's base URL")
			}
			kept = kept[:len(kept)-1]
		default:
			kept = append(kept, enc)
			continue
		}
		if last {
			trailingSlash = true
		}
	}
	out := "/" + strings.Join(kept, "/")
	if trailingSlash && len(kept) > 0 {
		out += "/"
	}
	// Escaping can triple a path's length; what is forwarded obeys the
	// same limit as what was asked for, or the result would not be its
	// own canonical form.
	if len(out) > maxSubpathBytes {
		return "", refuse(http.StatusRequestURITooLong, "path exceeds %d bytes once escaped", maxSubpathBytes)
	}
	return out, nil
}

// canonicalSegment checks one raw segment and returns its canonical
// encoding and its once-decoded value. A plain dot segment comes back as
// "." or ".." for the caller to resolve.
func canonicalSegment(seg string) (enc, dec string, _ *refusal) {
	var e, d strings.Builder
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		switch {
		case c == '%':
			if i+2 >= len(seg) || !isHex(seg[i+1]) || !isHex(seg[i+2]) {
				return "", "", refuse(http.StatusBadRequest, "malformed percent-encoding in path segment %q", clipText(seg))
			}
			b := unhex(seg[i+1])<<4 | unhex(seg[i+2])
			i += 2
			d.WriteByte(b)
			if isUnreserved(b) {
				e.WriteByte(b)
			} else {
				writeEscaped(&e, b)
			}
		case c == '\\':
			return "", "", refuse(http.StatusBadRequest, "backslash in path: some servers read it as /")
		case c < 0x20 || c == 0x7f:
			return "", "", refuse(http.StatusBadRequest, "control character in path")
		case isUnreserved(c) || strings.IndexByte("!$&'()*+,;=:@", c) >= 0:
			e.WriteByte(c)
			d.WriteByte(c)
		default: // space, non-ASCII and other characters a path must escape
			writeEscaped(&e, c)
			d.WriteByte(c)
		}
	}
	dec = d.String()
	if dec == "." || dec == ".." {
		return dec, dec, nil
	}
	if ref := checkReadings(seg, dec); ref != nil {
		return "", "", ref
	}
	return e.String(), dec, nil
}

// checkReadings refuses a segment (raw seg, decoded once dec) that some
// server could read as a dot segment or as more than one segment: after
// further decoding (also lenient, %uXXXX and "+" as space), NFKC folding,
// dropping ";params" or trimming spaces.
func checkReadings(seg, dec string) *refusal {
	seen := map[string]bool{dec: true}
	current := []string{dec}
	for round := 0; len(current) > 0; round++ {
		if round > maxDecodings {
			return refuse(http.StatusBadRequest, "path segment %q is encoded too many times", clipText(seg))
		}
		var next []string
		for _, r := range current {
			switch {
			case !utf8.ValidString(r):
				return refuse(http.StatusBadRequest, "path segment %q is not valid UTF-8 once decoded (lenient decoders read overlong forms such as %%C0%%AE as '.')", clipText(seg))
			case strings.ContainsAny(r, `/\`):
				return refuse(http.StatusBadRequest, "path segment %q holds an encoded / or \\: servers disagree whether it separates segments", clipText(seg))
			case strings.ContainsFunc(r, isControl):
				return refuse(http.StatusBadRequest, "path segment %q holds an encoded control character", clipText(seg))
			}
			name, _, _ := strings.Cut(r, ";")
			if isDotLike(name) {
				return refuse(http.StatusBadRequest, "path segment %q may be read as a dot segment (after decoding, Unicode folding, dropping ;parameters or trimming spaces)", clipText(seg))
			}
			for _, n := range otherReadings(r) {
				if !seen[n] {
					seen[n] = true
					next = append(next, n)
				}
			}
		}
		current = next
	}
	return nil
}

// otherReadings are what a server might make of r beyond its literal
// value.
func otherReadings(r string) []string {
	out := []string{norm.NFKC.String(r)}
	if strings.Contains(r, "%") {
		out = append(out, lenientUnescape(r))
	}
	if strings.Contains(r, "+") {
		out = append(out, strings.ReplaceAll(r, "+", " "))
	}
	return out
}

// lenientUnescape decodes what it can (%XX and IIS's %uXXXX) and keeps
// malformed escapes as they are, as forgiving decoders do.
func lenientUnescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] != '%':
			b.WriteByte(s[i])
		case i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
		case i+5 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U') && isHex(s[i+2]) && isHex(s[i+3]) && isHex(s[i+4]) && isHex(s[i+5]):
			r := rune(unhex(s[i+2]))<<12 | rune(unhex(s[i+3]))<<8 | rune(unhex(s[i+4]))<<4 | rune(unhex(s[i+5]))
			b.WriteRune(r)
			i += 5
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// isDotLike reports whether s is nothing but dots once whitespace and
// invisible format characters are dropped: ".", "..", "...", ". .".
func isDotLike(s string) bool {
	dots := 0
	for _, r := range s {
		switch {
		case r == '.' || r == '\u3002': // 。 is a full stop to IDNA-style mappings
			dots++
		case unicode.IsSpace(r) || unicode.Is(unicode.Cf, r):
		default:
			return false
		}
	}
	return dots > 0
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func writeEscaped(b *strings.Builder, c byte) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}

// clipText makes guest text safe and short for a refusal message.
func clipText(s string) string {
	const max = 80
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if isControl(r) {
			return '\uFFFD'
		}
		return r
	}, s)
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// requestPath is the escaped path exactly as the request named it.
// url.URL keeps that in RawPath whenever it differs from the default
// encoding of Path; EscapedPath would re-encode Path instead when RawPath
// holds characters a path should have escaped, losing the difference
// between "/" and "%2F".
func requestPath(u *url.URL) string {
	if u.RawPath != "" {
		return u.RawPath
	}
	return u.EscapedPath()
}
