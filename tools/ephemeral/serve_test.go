package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// settingsFrom runs serve's flag handling (with the action replaced) and
// returns the listen address and retention it ends up with.
func settingsFrom(t *testing.T, args []string, env map[string]string, config string) (string, time.Duration, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	if config != "" {
		path := filepath.Join(t.TempDir(), "serve.json")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	var listen string
	var retention time.Duration
	cmd := *serveCommand
	cmd.Action = func(c *cli.Context) error {
		if err := applyConfigFile(c); err != nil {
			return err
		}
		listen, retention = c.String("listen"), c.Duration("retention")
		return nil
	}
	app := &cli.App{Commands: []*cli.Command{&cmd}}
	err := app.Run(append([]string{"ephemeral", "serve"}, args...))
	return listen, retention, err
}

func TestServeSettingsPrecedence(t *testing.T) {
	const file = `{"listen": "127.0.0.1:9000", "retention": "48h"}`
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		config     string
		wantListen string
		wantKeep   time.Duration
	}{
		{"defaults", nil, nil, "", "127.0.0.1:8080", 30 * 24 * time.Hour},
		{"file", nil, nil, file, "127.0.0.1:9000", 48 * time.Hour},
		{"env beats file", nil, map[string]string{"EPHEMERAL_LISTEN": "127.0.0.1:9100"}, file, "127.0.0.1:9100", 48 * time.Hour},
		{"flag beats env", []string{"--listen", "127.0.0.1:9200"}, map[string]string{"EPHEMERAL_LISTEN": "127.0.0.1:9100"}, file, "127.0.0.1:9200", 48 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			listen, keep, err := settingsFrom(t, tt.args, tt.env, tt.config)
			if err != nil || listen != tt.wantListen || keep != tt.wantKeep {
				t.Fatalf("listen %q retention %v err %v; want %q %v", listen, keep, err, tt.wantListen, tt.wantKeep)
			}
		})
	}
}

func TestServeConfigRejectsUnknownSettings(t *testing.T) {
	_, _, err := settingsFrom(t, nil, nil, `{"listn": "0.0.0.0:80"}`)
	if err == nil || !strings.Contains(err.Error(), `"listn"`) {
		t.Fatalf("err %v", err)
	}
	_, _, err = settingsFrom(t, nil, nil, `{"retention": "forever"}`)
	if err == nil || !strings.Contains(err.Error(), "retention") {
		t.Fatalf("err %v", err)
	}
}
