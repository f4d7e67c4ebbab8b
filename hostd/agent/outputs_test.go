package agent

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

// outputLines are the run's Output entries and where the VM's end is.
func outputLines(events []store.Event) []string {
	var out []string
	for _, m := range messages(events) {
		if strings.HasPrefix(m, "Output: ") || m == "MicroVM: microVM destroyed" {
			out = append(out, m)
		}
	}
	return out
}

func storedOutputs(t *testing.T, e *env, runID string) map[string]string {
	t.Helper()
	listed, err := e.store.OutputsOf(context.Background(), []string{runID})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, o := range listed[runID] {
		full, err := e.store.Output(context.Background(), runID, o.Path)
		if err != nil {
			t.Fatal(err)
		}
		got[o.Path] = string(full.Data)
	}
	return got
}

// The files matching the run's patterns are copied out before the VM is
// destroyed, within the per-file and per-run caps; what is skipped and
// why, and a pattern that matched nothing, are on the timeline.
func TestOutputsAreCopiedBeforeTheVMIsDestroyed(t *testing.T) {
	vm := pageVM()
	e := newEnvConfig(t, Config{MaxOutputFileBytes: 100, MaxOutputBytes: 250}, vm, fakeprovider.Turn{Text: "done"})
	vm.files = map[string]string{
		"report.md":   "# report",
		"out/a.csv":   "a,b\n",
		"out/b.csv":   strings.Repeat("b", 90),
		"out/big.csv": strings.Repeat("x", 150),
		"out/c.csv":   strings.Repeat("c", 90),
		"out/d.csv":   strings.Repeat("d", 90),
		"notes.txt":   "not asked for",
	}
	spec := pageSpec("write a report")
	spec.Outputs = []string{"report.md", "out/*.csv", "missing.txt"}
	r, events := e.run(spec)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	want := []string{
		"Output: kept report.md (8 bytes)",
		"Output: kept out/a.csv (4 bytes)",
		"Output: kept out/b.csv (90 bytes)",
		"Output: skipped out/big.csv: 150 bytes over the 100 bytes per-file cap",
		"Output: kept out/c.csv (90 bytes)",
		"Output: skipped out/d.csv: 90 bytes would take the run's outputs past their 250 bytes cap",
		"Output: nothing matches missing.txt",
		"MicroVM: microVM destroyed",
	}
	if got := outputLines(events); !slices.Equal(got, want) {
		t.Errorf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if system := e.provider.Requests()[0].System; !strings.Contains(system, "matching report.md, out/*.csv, missing.txt are handed to the user") ||
		!strings.Contains(system, "at most 100 bytes each, 250 bytes together") {
		t.Errorf("the system prompt does not tell the model what is kept:\n%s", system)
	}
	got := storedOutputs(t, e, r.ID)
	if len(got) != 4 || got["report.md"] != "# report" || got["out/c.csv"] != vm.files["out/c.csv"] {
		t.Errorf("stored %v", got)
	}
	if slices.Contains(vm.reads, "out/big.csv") || slices.Contains(vm.reads, "out/d.csv") {
		t.Errorf("files over a cap were read: %v", vm.reads)
	}
}

// A guest that lies (about sizes, about what matched) or names files no
// API should show gets nothing past the host's checks.
func TestOutputsRefuseWhatAHostileGuestLists(t *testing.T) {
	vm := pageVM()
	e := newEnvConfig(t, Config{MaxOutputFileBytes: 100}, vm, fakeprovider.Turn{Text: "done"})
	vm.files = map[string]string{"report.md": strings.Repeat("r", 500), "out/ok.csv": "a,b", "etc/passwd": "root:x:0:0"}
	vm.listing = &vsockproto.OutputListing{Truncated: true, Entries: []vsockproto.OutputEntry{
		{Pattern: 0, Path: "report.md", Kind: vsockproto.OutputFile, Size: 2}, // says 2, sends 500
		{Pattern: 1, Path: "/etc/shadow", Kind: vsockproto.OutputFile, Size: 10},
		{Pattern: 1, Path: "out/../../etc/shadow", Kind: vsockproto.OutputFile, Size: 10},
		{Pattern: 1, Path: "etc/passwd", Kind: vsockproto.OutputFile, Size: 10},
		{Pattern: 1, Path: "out/\x1b[2Jevil.csv", Kind: vsockproto.OutputFile, Size: 1},
		{Pattern: 1, Path: "out/\xff.csv", Kind: vsockproto.OutputFile, Size: 1},
		{Pattern: 1, Path: "out", Kind: vsockproto.OutputSymlink},
		{Pattern: 1, Path: "out/link.csv", Kind: vsockproto.OutputSymlink},
		{Pattern: 1, Path: "out/fifo.csv", Kind: vsockproto.OutputOther},
		{Pattern: 1, Path: "out/secret.csv", Kind: vsockproto.OutputError, Error: "open: permission denied\x1b[0m"},
		{Pattern: 1, Path: "out/ok.csv", Kind: vsockproto.OutputFile, Size: 3},
		{Pattern: 1, Path: "out/ok.csv", Kind: vsockproto.OutputFile, Size: 3},
		{Pattern: 9, Path: "out/x.csv", Kind: vsockproto.OutputFile, Size: 3},
	}}
	spec := pageSpec("write a report")
	spec.Outputs = []string{"report.md", "out/*.csv"}
	r, events := e.run(spec)
	if r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	want := []string{
		"Output: skipped report.md: grew while being copied, past the 100 bytes it could take",
		`Output: skipped "/etc/shadow": the name is not a clean relative path`,
		`Output: skipped "out/../../etc/shadow": the name is not a clean relative path`,
		"Output: skipped etc/passwd: listed by the guest, but out/*.csv does not match it",
		`Output: skipped "out/\x1b[2Jevil.csv": the name holds control characters`,
		`Output: skipped "out/\xff.csv": the name is not valid UTF-8`,
		"Output: skipped out: a symbolic link (links are not followed)",
		"Output: skipped out/link.csv: a symbolic link (links are not followed)",
		"Output: skipped out/fifo.csv: not a regular file",
		"Output: skipped out/secret.csv: could not be read: open: permission denied [0m",
		"Output: kept out/ok.csv (3 bytes)",
		"Output: more than 1,000 entries match the output patterns; the rest are skipped",
		"MicroVM: microVM destroyed",
	}
	if got := outputLines(events); !slices.Equal(got, want) {
		t.Errorf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := storedOutputs(t, e, r.ID); len(got) != 1 || got["out/ok.csv"] != "a,b" {
		t.Errorf("stored %v", got)
	}
	if !slices.Equal(vm.reads, []string{"report.md", "out/ok.csv"}) {
		t.Errorf("read %q", vm.reads)
	}
}

func TestInputFilesKeepTheirMode(t *testing.T) {
	vm := pageVM()
	e := newEnv(t, vm, fakeprovider.Turn{Text: "ok"})
	spec := pageSpec("run it")
	spec.Files = []runs.File{{Path: "run.sh", Content: "#!/bin/sh\necho hi\n", Mode: 0o755}, {Path: "blob", Content: "\x00\xff\x01"}}
	if r, _ := e.run(spec); r.Status != store.Succeeded {
		t.Fatalf("status %s: %s", r.Status, r.ErrorMessage)
	}
	if vm.modes["run.sh"] != 0o755 || vm.modes["blob"] != 0 || vm.files["blob"] != "\x00\xff\x01" {
		t.Errorf("modes %v, blob %q", vm.modes, vm.files["blob"])
	}
}
