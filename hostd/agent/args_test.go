package agent

import (
	"strings"
	"testing"
	"time"
)

var shellArgCases = []struct {
	raw     string
	command string
	timeout time.Duration
	ok      bool
}{
	{`{"command":"pwd; whoami"}`, "pwd; whoami", time.Minute, true},
	{`{"command":"sleep 5","timeout_seconds":10}`, "sleep 5", 10 * time.Second, true},
	{`{"command":"x","timeout_seconds":100000}`, "x", time.Minute, true},
	{`{"command":"x","timeout_seconds":-1}`, "", 0, false},
	{`{"command":""}`, "", 0, false},
	{`{"command":"a\u0000b"}`, "", 0, false},
	{`{"command":"x","sudo":true}`, "", 0, false},
	{`{"command":"x"} {"command":"y"}`, "", 0, false},
	{`{"command":42}`, "", 0, false},
	{`null`, "", 0, false},
}

func TestParseShellArgs(t *testing.T) {
	for _, tc := range shellArgCases {
		command, timeout, err := parseShellArgs(tc.raw, time.Minute)
		if (err == nil) != tc.ok || command != tc.command || timeout != tc.timeout {
			t.Errorf("parseShellArgs(%s) = %q, %v, %v", tc.raw, command, timeout, err)
		}
	}
}

// Whatever a model sends, the parser either refuses it or returns a
// runnable command within the timeout ceiling.
func FuzzParseShellArgs(f *testing.F) {
	for _, tc := range shellArgCases {
		f.Add(tc.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		command, timeout, err := parseShellArgs(raw, time.Minute)
		if err != nil {
			return
		}
		if strings.TrimSpace(command) == "" || strings.ContainsRune(command, 0) || timeout <= 0 || timeout > time.Minute || len(raw) > maxArgumentBytes {
			t.Errorf("accepted %q: command %q, timeout %v", raw, command, timeout)
		}
	})
}

func TestCheckScratchPath(t *testing.T) {
	for p, ok := range map[string]bool{
		"notes.txt": true, "data/in.csv": true, "..data": true,
		"": false, ".": false, "/etc/passwd": false, "../x": false, "..": false,
		"a/../../x": false, "a//b": false, "a\x00b": false,
	} {
		if err := checkScratchPath(p); (err == nil) != ok {
			t.Errorf("checkScratchPath(%q) = %v", p, err)
		}
	}
}

func TestClipKeepsRunes(t *testing.T) {
	if got := clip("ab€cd", 3); got != "ab…" {
		t.Errorf("clip = %q", got)
	}
	if got := clip("short", 10); got != "short" {
		t.Errorf("clip = %q", got)
	}
}
