package model

import (
	"strings"
	"testing"
)

func TestNormalizeToolCalls(t *testing.T) {
	calls := []ToolCall{
		{ID: "a", Name: "shell", Arguments: `{"command":"pwd"}`},
		{ID: "a", Name: "shell", Arguments: `{"command":"whoami"}`}, // duplicate id
		{Name: "shell", Arguments: `{"command":`},                   // no id, truncated JSON
		{ID: "d", Name: "shell", Arguments: `["not","an","object"]`},
		{ID: "e", Name: "shell", Arguments: `null`},
		{ID: "f", Name: "", Arguments: `{}`},
		{ID: "g", Name: "shell", Arguments: ""},
		{ID: "call_1", Name: "shell", Arguments: `{}`}, // collides with a generated id
	}
	NormalizeToolCalls(calls)

	seen := map[string]bool{}
	for i, c := range calls {
		if c.ID == "" || seen[c.ID] {
			t.Errorf("call %d: id %q is empty or repeated", i, c.ID)
		}
		seen[c.ID] = true
	}
	wantFlagged := map[int]string{2: "not a JSON object", 3: "not a JSON object", 4: "null", 5: "no tool name", 6: "empty"}
	for i, c := range calls {
		want, flagged := wantFlagged[i]
		switch {
		case flagged && !strings.Contains(c.ArgumentsError, want):
			t.Errorf("call %d (%q): error %q, want it to mention %q", i, c.Arguments, c.ArgumentsError, want)
		case !flagged && c.ArgumentsError != "":
			t.Errorf("call %d (%q): unexpected error %q", i, c.Arguments, c.ArgumentsError)
		}
	}
	if calls[2].Arguments != `{"command":` {
		t.Errorf("raw arguments not kept: %q", calls[2].Arguments)
	}
}
