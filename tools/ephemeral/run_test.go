package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// The shipped recording asks what the product page asked.
func TestReplayFromTheShippedRecording(t *testing.T) {
	var spec runs.Spec
	replay, err := loadReplay("../../examples/product-page.json", &spec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(spec.Prompt, "This is a sandbox test.") || spec.Model != "openai/gpt-6-luna" || !spec.Shell {
		t.Errorf("spec %+v", spec)
	}
	if replay.Model() != spec.Model {
		t.Errorf("replay serves %q", replay.Model())
	}
}

// A recording of a run that was offered web_fetch replays with web; the
// product page's, which had only the shell, without.
func TestReplayGrantsWebWhenRecorded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "web.json")
	recording := `{"version": 2, "exchanges": [{"turn": 1, "request": {"model": "openai/gpt-6-luna", "kept_messages": 0,
		"messages": [{"role": "user", "text": "fetch it"}], "tools": [{"name": "web_fetch"}]},
		"response": {"stop_reason": "end_turn", "text": "done"}}]}`
	if err := os.WriteFile(path, []byte(recording), 0o600); err != nil {
		t.Fatal(err)
	}
	var spec runs.Spec
	if _, err := loadReplay(path, &spec); err != nil {
		t.Fatal(err)
	}
	if !spec.Web || spec.Shell {
		t.Errorf("web_fetch recording replays with web %v, shell %v", spec.Web, spec.Shell)
	}
	if _, err := loadReplay("../../examples/product-page.json", &spec); err != nil || spec.Web || !spec.Shell {
		t.Errorf("product page replays with web %v, shell %v (%v)", spec.Web, spec.Shell, err)
	}
}

func TestReplayRefusesBadRecordings(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"not json":     `{"version":`,
		"old version":  `{"version": 0, "exchanges": []}`,
		"no exchanges": `{"version": 1, "exchanges": []}`,
		"no prompt":    `{"version": 1, "exchanges": [{"turn": 1, "request": {"model": "openai/gpt-6-luna", "messages": []}, "response": {"stop_reason": "end_turn"}}]}`,
		"cut before its first turn": `{"version": 2, "truncated": {"kept_turns": 0, "dropped_turns": 3, "dropped_bytes": 9000000, "limit_bytes": 8388608},
			"exchanges": []}`,
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadReplay(path, &runs.Spec{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := loadReplay(filepath.Join(dir, "missing.json"), &runs.Spec{}); err == nil {
		t.Error("missing file accepted")
	}
}

// A live run uses the model named, else the configured default; with
// neither, or with a model whose provider is not configured, it stops
// before booting anything and lists the usable models.
func TestLiveModelIsNamedOrConfigured(t *testing.T) {
	models, err := registry.New(registry.Config{OpenAI: registry.ProviderConfig{APIKey: "sk-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := liveModel("gpt-4o-mini", "gpt-4o", models); err != nil || m != "gpt-4o-mini" {
		t.Errorf("named: %q %v", m, err)
	}
	if m, err := liveModel("", "gpt-4o", models); err != nil || m != "gpt-4o" {
		t.Errorf("configured: %q %v", m, err)
	}
	for named, want := range map[string]string{"": "give --model NAME (no default-model is configured)", "claude-haiku-4-5": "anthropic-api-key"} {
		_, err := liveModel(named, "", models)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "usable models: gpt-4.1,") {
			t.Errorf("%q: %v", named, err)
		}
	}
}
