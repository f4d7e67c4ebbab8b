package broker

import (
	"net/http"
	"strings"
	"testing"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// subpathCases are paths under a connection: the canonical form the
// broker forwards, or the status it refuses them with.
var subpathCases = []struct {
	raw    string
	want   string
	status int // 0: forwarded as want
}{
	{raw: "", want: ""},
	{raw: "/", want: "/"},
	{raw: "/v1/customers", want: "/v1/customers"},
	{raw: "/v1/customers/", want: "/v1/customers/"},
	{raw: "/v1//x", want: "/v1/x"},
	{raw: "//v1///x//", want: "/v1/x/"},
	{raw: "//evil.example/x", want: "/evil.example/x"},
	{raw: "/v1/a%20b", want: "/v1/a%20b"},
	{raw: "/v1/%7euser/%41%2d", want: "/v1/~user/A-"},
	{raw: "/v1/a%2cb", want: "/v1/a%2Cb"},
	{raw: "/v1/a,b;c=d@e:f!$&'()*+", want: "/v1/a,b;c=d@e:f!$&'()*+"},
	{raw: "/v1/caf\u00e9", want: "/v1/caf%C3%A9"},
	{raw: "/v1/caf%c3%a9", want: "/v1/caf%C3%A9"},
	{raw: "/v1/{x}|^\"<>`[]#", want: "/v1/%7Bx%7D%7C%5E%22%3C%3E%60%5B%5D%23"},
	{raw: "/v1/./x", want: "/v1/x"},
	{raw: "/v1/../v2", want: "/v2"},
	{raw: "/v1/%2e%2e/v2", want: "/v2"},
	{raw: "/v1/..", want: "/"},
	{raw: "/v1/.", want: "/v1/"},
	{raw: "/100%25", want: "/100%25"},
	{raw: "/%2541", want: "/%2541"},
	{raw: "/a..b/.well-known/x.", want: "/a..b/.well-known/x."},
	{raw: "/items;v=1", want: "/items;v=1"},
	{raw: "/a/%3B", want: "/a/%3B"},
	{raw: "/a/;x", want: "/a/;x"},

	// Dot segments that climb above the base.
	{raw: "/..", status: 403},
	{raw: "/v1/../../admin", status: 403},
	{raw: "/%2e%2e/admin", status: 403},
	{raw: "/%2E%2E/admin", status: 403},
	{raw: "/.%2e/admin", status: 403},
	{raw: "/./..", status: 403},

	// Dot segments to some servers: path parameters, encodings, Unicode,
	// trimming.
	{raw: "/..;/x", status: 400},
	{raw: "/customers/..;/x", status: 400},
	{raw: "/v1/..;/..;/admin", status: 400},
	{raw: "/..;jsessionid=1/x", status: 400},
	{raw: "/.;/x", status: 400},
	{raw: "/..%3b/x", status: 400},
	{raw: "/..%3B/x", status: 400},
	{raw: "/..%20/x", status: 400},
	{raw: "/.. /x", status: 400},
	{raw: "/..+/x", status: 400},
	{raw: "/%20../x", status: 400},
	{raw: "/..%09/x", status: 400},
	{raw: "/..\u200b/x", status: 400},
	{raw: "/%C0%AE%C0%AE/x", status: 400},
	{raw: "/%c0%ae/x", status: 400},
	{raw: "/%e0%80%ae%e0%80%ae/x", status: 400},
	{raw: "/%25c0%25ae%25c0%25ae/x", status: 400},
	{raw: "/\uff0e\uff0e/x", status: 400},
	{raw: "/%EF%BC%8E%EF%BC%8E/x", status: 400},
	{raw: "/\u2025/x", status: 400},
	{raw: "/\u2024\u2024/x", status: 400},
	{raw: "/\ufe52\ufe52/x", status: 400},
	{raw: "/\u2026/x", status: 400},
	{raw: "/\u3002\u3002/x", status: 400},
	{raw: "/\uff05\uff12\uff45\uff05\uff12\uff45/x", status: 400}, // fullwidth "%2e%2e"
	{raw: "/.../x", status: 400},
	{raw: "/..../x", status: 400},
	{raw: "/%252e%252e/admin", status: 400},
	{raw: "/%25252e%25252e/admin", status: 400},
	{raw: "/%25u002e%25u002e/admin", status: 400},

	// Separators to some servers.
	{raw: "/a\\..\\b", status: 400},
	{raw: "/a\\b", status: 400},
	{raw: "/a%5c..%5cb", status: 400},
	{raw: "/a%2fb", status: 400},
	{raw: "/a%2F..%2Fb", status: 400},
	{raw: "/a%252fb", status: 400},
	{raw: "/a%25zz%252f..%252f..%252fadmin", status: 400},
	{raw: "/a\uff0fb", status: 400},
	{raw: "/a\uff3cb", status: 400},

	// Malformed.
	{raw: "/a%00", status: 400},
	{raw: "/a%0d%0aX: y", status: 400},
	{raw: "/a\x7f", status: 400},
	{raw: "/a%c2%85", status: 400},
	{raw: "/a%zz", status: 400},
	{raw: "/a%", status: 400},
	{raw: "/a%2", status: 400},
	{raw: "/%u002e", status: 400},
	{raw: "/%ff", status: 400},
	{raw: "/\xff", status: 400},
	{raw: "/%252525252541", status: 400}, // six layers deep
	{raw: "v1", status: 400},
	{raw: "/" + strings.Repeat("a", maxSubpathBytes), status: http.StatusRequestURITooLong},
	{raw: "/" + strings.Repeat("#", maxSubpathBytes/2), status: http.StatusRequestURITooLong},
}

func TestCanonicalSubpath(t *testing.T) {
	for _, c := range subpathCases {
		got, ref := canonicalSubpath(c.raw)
		switch {
		case c.status == 0 && ref != nil:
			t.Errorf("%q refused: %v", c.raw, ref)
		case c.status == 0 && got != c.want:
			t.Errorf("%q: canonical %q, want %q", c.raw, got, c.want)
		case c.status != 0 && ref == nil:
			t.Errorf("%q forwarded as %q, want %d", c.raw, got, c.status)
		case c.status != 0 && ref.status != c.status:
			t.Errorf("%q: refused with %d (%s), want %d", c.raw, ref.status, ref.reason, c.status)
		}
	}
}

// What the canonicaliser forwards stays under the base path however a
// server reads it, is its own canonical form, and nothing panics.
func FuzzCanonicalSubpath(f *testing.F) {
	for _, c := range subpathCases {
		f.Add(c.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, ref := canonicalSubpath(raw)
		if ref != nil {
			if ref.status != 400 && ref.status != 403 && ref.status != 414 {
				t.Fatalf("%q: refused with %d", raw, ref.status)
			}
			return
		}
		if got != "" && got[0] != '/' {
			t.Fatalf("%q: canonical %q is not a path", raw, got)
		}
		again, ref := canonicalSubpath(got)
		if ref != nil || again != got {
			t.Fatalf("%q: canonical %q canonicalises to %q, %v", raw, got, again, ref)
		}
		if p, ok := paranoidServer("/base" + got); !ok || (p != "/base" && !strings.HasPrefix(p, "/base/")) {
			t.Fatalf("%q: forwarded as %q, a server may read /base%s as %q (resolvable: %v)", raw, got, got, p, ok)
		}
	})
}

// paranoidServer reads a path as the most forgiving server imaginable
// would: percent-decoding again and again (leniently, %uXXXX and "+" as
// space too), overlong UTF-8 as ASCII, NFKC folding, "\" as "/", ";params"
// dropped, spaces and invisible characters trimmed, any run of dots as
// "..". It returns the resolved path, or false when it climbs above "/".
func paranoidServer(p string) (string, bool) {
	for i := 0; i < 8; i++ {
		p = norm.NFKC.String(asciiOverlongs(lenientUnescape(strings.ReplaceAll(p, "+", " "))))
	}
	p = strings.ReplaceAll(p, "\\", "/")
	var kept []string
	for _, seg := range strings.Split(p, "/") {
		seg, _, _ = strings.Cut(seg, ";")
		seg = strings.TrimFunc(seg, func(r rune) bool { return unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) })
		switch {
		case seg == "":
		case strings.Trim(seg, ".\u3002") == "" && seg != ".":
			if len(kept) == 0 {
				return "", false
			}
			kept = kept[:len(kept)-1]
		case seg == ".":
		default:
			kept = append(kept, seg)
		}
	}
	return "/" + strings.Join(kept, "/"), true
}

// asciiOverlongs decodes overlong UTF-8 encodings of ASCII (C0 AE, E0 80
// AE, ...) as lenient decoders do.
func asciiOverlongs(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case (c == 0xc0 || c == 0xc1) && i+1 < len(s) && s[i+1]&0xc0 == 0x80:
			b.WriteByte((c&1)<<6 | s[i+1]&0x3f)
			i++
		case c == 0xe0 && i+2 < len(s) && s[i+1]&0xe0 == 0x80 && s[i+2]&0xc0 == 0x80:
			b.WriteByte((s[i+1]&1)<<6 | s[i+2]&0x3f)
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func TestParanoidServerSeesTheAttacks(t *testing.T) {
	// The fuzz target's oracle must itself catch what the canonicaliser
	// refuses, or the fuzz test proves nothing.
	for _, raw := range []string{"/..;/x", "/%252e%252e/x", "/%C0%AE%C0%AE/x", "/\uff0e\uff0e/x", "/.. /x", "/a\\..\\..\\x", "/.../x", "/%25u002e%25u002e/x"} {
		if p, ok := paranoidServer("/base" + raw); ok && strings.HasPrefix(p, "/base/") {
			t.Errorf("the oracle reads /base%s as %q", raw, p)
		}
	}
}

// BenchmarkCanonicalSubpath measures the canonicaliser on a typical API
// path with a percent-encoded segment.
func BenchmarkCanonicalSubpath(b *testing.B) {
	for b.Loop() {
		if _, ref := canonicalSubpath("/v1/customers/42/notes/caf%C3%A9%20au%20lait"); ref != nil {
			b.Fatal(ref)
		}
	}
}
