package config

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the README's configuration table")

const (
	tableBegin = "<!-- BEGIN configuration table: generated from hostd/config (go test ./hostd/config -update) -->\n"
	tableEnd   = "<!-- END configuration table -->"
)

// The README's configuration table is the table in the code.
func TestREADMEListsEverySetting(t *testing.T) {
	const readme = "../../README.md"
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, tableBegin)
	end := strings.Index(text, tableEnd)
	if start < 0 || end < start {
		t.Fatalf("README.md lacks the markers %q and %q around the configuration table", tableBegin, tableEnd)
	}
	have := text[start+len(tableBegin) : end]
	want := markdownTable()
	if have == want {
		return
	}
	if *update {
		if err := os.WriteFile(readme, []byte(text[:start+len(tableBegin)]+want+text[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("README.md's configuration table is out of date; run go test ./hostd/config -update. Want:\n%s", want)
}

// markdownTable is the README's configuration table: every setting with
// its flag, variable, file key, default and meaning. A test keeps the
// README's copy equal to it.
func markdownTable() string {
	var b strings.Builder
	b.WriteString("| file key | flag | environment | default | meaning |\n")
	b.WriteString("|---|---|---|---|---|\n")
	for _, s := range Settings {
		key := "`" + s.Name + "`"
		if s.field == nil {
			key = "—"
		}
		def := s.DefaultText()
		switch {
		case s.Name == "max-concurrent-runs":
			def = "one per CPU"
		case s.Name == "pool-size":
			def = "one per CPU, memory allowing"
		case def == "":
			def = "—"
		default:
			def = "`" + def + "`"
		}
		usage := strings.ReplaceAll(s.Usage, "|", `\|`)
		if s.Secret {
			usage += " (secret: never printed)"
		}
		fmt.Fprintf(&b, "| %s | `%s` | `%s` | %s | %s (%s) |\n", key, "--"+s.Name, s.Env(), def, usage, s.Kind())
	}
	return b.String()
}
