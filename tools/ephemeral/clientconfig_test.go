package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/config"
)

var update = flag.Bool("update", false, "rewrite the README's table of client settings")

const (
	clientTableBegin = "<!-- BEGIN client settings table: generated from tools/ephemeral (go test ./tools/ephemeral -update) -->\n"
	clientTableEnd   = "<!-- END client settings table -->"
)

// The README's table of the remote commands' settings is the table in
// the code.
func TestREADMEListsEveryClientSetting(t *testing.T) {
	const readme = "../../README.md"
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, clientTableBegin)
	end := strings.Index(text, clientTableEnd)
	if start < 0 || end < start {
		t.Fatalf("README.md lacks the markers %q and %q around the client settings table", clientTableBegin, clientTableEnd)
	}
	var want strings.Builder
	want.WriteString("| flag | environment | default | meaning |\n|---|---|---|---|\n")
	for _, s := range clientSettings {
		def := "—"
		if s.def != "" {
			def = "`" + s.def + "`"
		}
		usage := s.usage
		if s.secret {
			usage += " (secret: never printed)"
		}
		fmt.Fprintf(&want, "| `--%s` | `%s` | %s | %s |\n", s.name, s.env, def, usage)
	}
	if have := text[start+len(clientTableBegin) : end]; have == want.String() {
		return
	}
	if *update {
		if err := os.WriteFile(readme, []byte(text[:start+len(clientTableBegin)]+want.String()+text[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("README.md's client settings table is out of date; run go test ./tools/ephemeral -update. Want:\n%s", want.String())
}

// The client's settings are apart from the daemon's: serve never reads
// them and --print-config never shows them.
func TestClientSettingsAreNotDaemonSettings(t *testing.T) {
	for _, s := range clientSettings {
		if _, ok := config.Lookup(s.name); ok {
			t.Errorf("%s is also a daemon setting", s.name)
		}
		for _, d := range config.Settings {
			if d.Env() == s.env {
				t.Errorf("%s is also the daemon's %s", s.env, d.Name)
			}
		}
	}
	t.Setenv("EPHEMERAL_API_KEY", "eph_0123456789abcdef_secret")
	out, err := printConfig(t, "serve")
	if err != nil || strings.Contains(out, "eph_0123456789abcdef") || row(out, "api-key") != "" || row(out, "url") != "" {
		t.Errorf("serve --print-config:\n%s %v", out, err)
	}
}
