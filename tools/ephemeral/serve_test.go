package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// printConfig runs `ephemeral ARGS... serve --print-config` as the binary
// would and returns what it printed.
func printConfig(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{Flags: settingFlags("config", "state-dir"), Commands: []*cli.Command{serveCommand}, Writer: &out}
	err := app.Run(append(append([]string{"ephemeral"}, args...), "--print-config"))
	return out.String(), err
}

// row is the line --print-config prints for a setting.
func row(out, setting string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, setting+" ") {
			return strings.Join(strings.Fields(line), " ")
		}
	}
	return ""
}

// The command line, the environment and the file reach serve through the
// one loader, with flags after the command beating those before it.
func TestServeTakesSettingsFromEverySource(t *testing.T) {
	file := filepath.Join(t.TempDir(), "serve.json")
	if err := os.WriteFile(file, []byte(`{"retention": "48h", "max-cost-micros": 100000000, "listen": "127.0.0.1:9000", "openai-api-key": "sk-from-file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("EPHEMERAL_LISTEN", "127.0.0.1:9100")
	t.Setenv("EPHEMERAL_JANITOR_INTERVAL", "5m")
	out, err := printConfig(t, "--state-dir", "/srv/before", "--config", file, "serve", "--listen", "127.0.0.1:9200")
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{
		"state-dir":        "state-dir /srv/before flag --state-dir",
		"listen":           "listen 127.0.0.1:9200 flag --listen",
		"janitor-interval": "janitor-interval 5m env EPHEMERAL_JANITOR_INTERVAL",
		"retention":        "retention 48h file " + file,
		"max-cost-micros":  "max-cost-micros 100000000 file " + file,
		"openai-api-key":   "openai-api-key <redacted> file " + file,
		"shutdown-timeout": "shutdown-timeout 30s default",
	} {
		if got := row(out, setting); got != want {
			t.Errorf("%s: %q, want %q", setting, got, want)
		}
	}
	if strings.Contains(out, "sk-from-file") {
		t.Errorf("the secret is printed:\n%s", out)
	}
	out, err = printConfig(t, "--state-dir", "/srv/before", "serve", "--state-dir", "/srv/after")
	if err != nil || row(out, "state-dir") != "state-dir /srv/after flag --state-dir" {
		t.Errorf("the command's own flag should win: %q %v", row(out, "state-dir"), err)
	}
}

func TestServeRefusesBadSettings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "serve.json")
	if err := os.WriteFile(file, []byte(`{"listn": "0.0.0.0:80"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := printConfig(t, "serve", "--config", file); err == nil || !strings.Contains(err.Error(), `"listn"`) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := printConfig(t, "serve", "--max-concurrent-runs", "many"); err == nil || !strings.Contains(err.Error(), "max-concurrent-runs") {
		t.Fatalf("bad flag: %v", err)
	}
}
