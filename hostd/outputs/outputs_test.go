package outputs

import (
	"strings"
	"testing"
)

func TestCheckPattern(t *testing.T) {
	for _, ok := range []string{"report.md", "out/*.csv", "out/?/[a-c]*.json", "a b/c.txt", "ü/*"} {
		if msg := CheckPattern(ok); msg != "" {
			t.Errorf("%q refused: %s", ok, msg)
		}
	}
	for p, want := range map[string]string{
		"":                        "1 to 255",
		strings.Repeat("a", 256):  "1 to 255",
		"/etc/shadow":             "relative",
		"../x":                    "'..'",
		"out/../../x":             "clean",
		"a/../b":                  "clean",
		"..":                      "'..'",
		"./a":                     "clean",
		"a//b":                    "clean",
		"a/":                      "clean",
		".":                       "clean",
		"out/**/*.csv":            `"**"`,
		"out/[a-":                 "glob syntax",
		"a\\*":                    "backslash",
		"a\x00b":                  "NUL",
		"a\nb":                    "control",
		"\xff":                    "UTF-8",
		"out/*.csv\u0085":         "control",
		strings.Repeat("a/", 100): "clean",
	} {
		if msg := CheckPattern(p); !strings.Contains(msg, want) {
			t.Errorf("CheckPattern(%q) = %q, want it to mention %q", p, msg, want)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, name  string
		full, onTheWay bool
	}{
		{"out/*.csv", "out/a.csv", true, false},
		{"out/*.csv", "out", false, true},
		{"out/*.csv", "out/a.txt", false, false},
		{"out/*.csv", "out/sub/a.csv", false, false},
		{"out/*.csv", "other", false, false},
		{"*/x/*.csv", "a", false, true},
		{"*/x/*.csv", "a/y", false, false},
		{"report.md", "report.md", true, false},
		{"report.md", "/etc/shadow", false, false},
		{"*", "../x", false, false},
	} {
		full, way := Match(tc.pattern, tc.name)
		if full != tc.full || way != tc.onTheWay {
			t.Errorf("Match(%q, %q) = %v, %v; want %v, %v", tc.pattern, tc.name, full, way, tc.full, tc.onTheWay)
		}
	}
}

func TestCheckName(t *testing.T) {
	for name, bad := range map[string]bool{
		"report.md": false, "out/a.csv": false, "ünï/ç.txt": false,
		"out/\xff.csv": true, "a\x1b[31m": true, "a\u0085b": true, "/etc/shadow": true, "../x": true, "a//b": true, "": true,
	} {
		if got := CheckName(name) != ""; got != bad {
			t.Errorf("CheckName(%q) refuses: %v, want %v", name, got, bad)
		}
	}
	if p := Printable("out/\xff\x1b.csv"); p != `"out/\xff\x1b.csv"` {
		t.Errorf("Printable = %s", p)
	}
}

func TestContentType(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"report.md", "# Hi", "text/markdown; charset=utf-8"},
		{"out/a.CSV", "a,b\n", "text/csv; charset=utf-8"},
		{"latin1.csv", "caf\xe9\n", "text/csv"},
		{"page.html", "<script>alert(1)</script>", "text/html; charset=utf-8"},
		{"data.json", "{}", "application/json"},
		{"noext", "<html><body>", "text/html; charset=utf-8"},
		{"noext", "plain words", "text/plain; charset=utf-8"},
		{"blob.bin", "\x00\x01\x02\xff", "application/octet-stream"},
		{"image", "\x89PNG\r\n\x1a\n", "image/png"},
	} {
		if got := ContentType(tc.name, []byte(tc.data)); got != tc.want {
			t.Errorf("ContentType(%q, %q) = %q, want %q", tc.name, tc.data, got, tc.want)
		}
	}
}
