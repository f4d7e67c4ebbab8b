package config

import (
	"io/fs"
	"strings"
	"testing"
	"time"
)

// inputs builds Load's inputs from maps, with the file at "serve.json".
func inputs(flags, env map[string]string, file string) Inputs {
	return Inputs{
		Flags: flags,
		Getenv: func(k string) (string, bool) {
			v, ok := env[k]
			return v, ok
		},
		ReadFile: func(path string) ([]byte, error) {
			if path != "serve.json" || file == "" {
				return nil, fs.ErrNotExist
			}
			return []byte(file), nil
		},
	}
}

func TestPrecedenceFlagEnvFileDefault(t *testing.T) {
	const file = `{"listen": "127.0.0.1:9000", "retention": "48h"}`
	tests := []struct {
		name       string
		flags, env map[string]string
		file       string
		wantListen string
		wantFrom   Source
		wantKeep   time.Duration
	}{
		{"defaults", nil, nil, "", "127.0.0.1:8080", "default", 30 * 24 * time.Hour},
		{"file", map[string]string{"config": "serve.json"}, nil, file, "127.0.0.1:9000", "file serve.json", 48 * time.Hour},
		{"file named by env", nil, map[string]string{"EPHEMERAL_CONFIG": "serve.json"}, file, "127.0.0.1:9000", "file serve.json", 48 * time.Hour},
		{"env beats file", map[string]string{"config": "serve.json"}, map[string]string{"EPHEMERAL_LISTEN": "127.0.0.1:9100"}, file,
			"127.0.0.1:9100", "env EPHEMERAL_LISTEN", 48 * time.Hour},
		{"flag beats env", map[string]string{"config": "serve.json", "listen": "127.0.0.1:9200"}, map[string]string{"EPHEMERAL_LISTEN": "127.0.0.1:9100"}, file,
			"127.0.0.1:9200", "flag --listen", 48 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Load(inputs(tt.flags, tt.env, tt.file))
			if err != nil {
				t.Fatal(err)
			}
			if l.Config.Listen != tt.wantListen || l.Sources["listen"] != tt.wantFrom || l.Config.Retention != tt.wantKeep {
				t.Fatalf("listen %q from %q, retention %v; want %q from %q, %v",
					l.Config.Listen, l.Sources["listen"], l.Config.Retention, tt.wantListen, tt.wantFrom, tt.wantKeep)
			}
		})
	}
}

func TestFileValuesAreTyped(t *testing.T) {
	for _, file := range []string{
		`{"max-cost-micros": 100000000}`, // was "1e+08 parse error"
		`{"max-cost-micros": 1e8}`,
		`{"max-cost-micros": 1.0e8}`,
	} {
		l, err := Load(inputs(map[string]string{"config": "serve.json"}, nil, file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if l.Config.MaxCostMicros != 100_000_000 {
			t.Fatalf("%s: max-cost-micros %d", file, l.Config.MaxCostMicros)
		}
	}
	l, err := Load(inputs(map[string]string{"config": "serve.json"}, nil,
		`{"max-concurrent-runs": 3, "command-timeout": "90s", "openai-api-key": "sk-x", "vmm": "qemu"}`))
	if err != nil {
		t.Fatal(err)
	}
	if l.Config.MaxConcurrentRuns != 3 || l.Config.CommandTimeout != 90*time.Second || l.Config.OpenAIAPIKey != "sk-x" || l.Config.VMM != VMMQEMU {
		t.Fatalf("%+v", l.Config)
	}
}

func TestBadValuesNameTheSettingAndSource(t *testing.T) {
	tests := []struct {
		name       string
		flags, env map[string]string
		file       string
		want       []string
	}{
		{"unknown key", nil, nil, `{"listn": "0.0.0.0:80"}`, []string{`unknown setting "listn"`, "serve.json"}},
		{"duration as number", nil, nil, `{"retention": 3600}`, []string{"retention", "duration string", "a number"}},
		{"bad duration", nil, nil, `{"retention": "forever"}`, []string{"retention", `"forever"`}},
		{"fraction", nil, nil, `{"max-cost-micros": 1.5}`, []string{"max-cost-micros", "whole number"}},
		{"string for int", nil, nil, `{"max-cost-micros": "100"}`, []string{"max-cost-micros", "integer", "a string"}},
		{"not an object", nil, nil, `["listen"]`, []string{"one JSON object"}},
		{"trailing data", nil, nil, `{"listen": "a:1"} {}`, []string{"after the JSON object"}},
		{"config in file", nil, nil, `{"config": "x.json"}`, []string{"names the file itself"}},
		{"bad env", nil, map[string]string{"EPHEMERAL_MAX_CONCURRENT_RUNS": "lots"}, "", []string{"max-concurrent-runs", "env EPHEMERAL_MAX_CONCURRENT_RUNS", `"lots"`}},
		{"bad flag", map[string]string{"janitor-interval": "1 hour"}, nil, "", []string{"janitor-interval", "flag --janitor-interval"}},
		{"unknown vmm", nil, map[string]string{"EPHEMERAL_VMM": "firecracker"}, "", []string{"vmm", `"firecracker"`}},
		{"negative", map[string]string{"max-cost-micros": "-1"}, nil, "", []string{"max-cost-micros", "positive"}},
		{"metrics address without port", map[string]string{"metrics-listen": "127.0.0.1"}, nil, "", []string{"metrics-listen", "host:port"}},
		{"no stream for a key", nil, map[string]string{"EPHEMERAL_LIMIT_KEY_STREAMS": "0"}, "", []string{"limit-key-streams", "positive"}},
		{"short secret", nil, map[string]string{"EPHEMERAL_SECRET_KEY": "abcd"}, "", []string{"secret-key", "64 hex digits"}},
		{"missing file", map[string]string{"config": "nowhere.json"}, nil, "", []string{"flag --config", "not exist"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flags := tt.flags
			if tt.file != "" {
				flags = map[string]string{"config": "serve.json"}
			}
			_, err := Load(inputs(flags, tt.env, tt.file))
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestPrintRedactsSecretsAndSaysWhereValuesCameFrom(t *testing.T) {
	l, err := Load(inputs(map[string]string{"config": "serve.json", "listen": "127.0.0.1:1"},
		map[string]string{"EPHEMERAL_ANTHROPIC_API_KEY": "sk-ant-very-secret"},
		`{"openai-api-key": "sk-openai-very-secret", "retention": "48h"}`))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := l.Print(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "very-secret") {
		t.Fatalf("a secret is printed:\n%s", out)
	}
	for _, want := range []string{
		"config ", "serve.json", "flag --config",
		"listen ", "127.0.0.1:1", "flag --listen",
		"anthropic-api-key", Redacted, "env EPHEMERAL_ANTHROPIC_API_KEY",
		"openai-api-key", "file serve.json",
		"retention ", "48h",
		"janitor-interval", "1h", "default",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("print lacks %q:\n%s", want, out)
		}
	}
	for _, s := range Settings {
		if !strings.Contains(out, s.Name) {
			t.Errorf("print lacks setting %s", s.Name)
		}
	}
}

func TestEverySettingHasAFieldOfItsOwn(t *testing.T) {
	seen := map[any]string{}
	var c Config
	for _, s := range Settings {
		if s.Usage == "" {
			t.Errorf("%s has no usage text", s.Name)
		}
		if s.field == nil {
			continue
		}
		p := s.field(&c)
		if other, dup := seen[p]; dup {
			t.Errorf("%s and %s set the same field", s.Name, other)
		}
		seen[p] = s.Name
	}
	if _, err := Load(Inputs{}); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestDefaultPoolSizeFollowsCPUsAndMemory(t *testing.T) {
	for _, tc := range []struct {
		cpus   int
		memory uint64
		want   int
	}{
		{2, 24 << 30, 2}, // this project's machines: one per CPU
		{16, 8 << 30, 4}, // memory-bound: one per 2 GiB
		{4, 1 << 30, 0},  // too little memory for even one
		{1, 0, 0},        // memory unknown
	} {
		if got := defaultPoolSize(tc.cpus, tc.memory); got != tc.want {
			t.Errorf("defaultPoolSize(%d CPUs, %d GiB) = %d, want %d", tc.cpus, tc.memory>>30, got, tc.want)
		}
	}
}

func TestDefaultCapacityFollowsCPUsAndMemory(t *testing.T) {
	for _, tc := range []struct {
		cpus   int
		memory uint64
		want   int
	}{
		{2, 24 << 30, 2},   // this project's machines: one per CPU
		{64, 16 << 30, 16}, // memory-bound: one per GiB
		{4, 512 << 20, 1},  // always at least one
		{8, 0, 8},          // memory unknown: the CPUs decide
	} {
		if got := defaultCapacity(tc.cpus, tc.memory); got != tc.want {
			t.Errorf("defaultCapacity(%d CPUs, %d MiB) = %d, want %d", tc.cpus, tc.memory>>20, got, tc.want)
		}
	}
}
