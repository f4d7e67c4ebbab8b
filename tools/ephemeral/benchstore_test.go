package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// A small run of `ephemeral bench store` measures every row on each size
// and prints the table with its ratios.
func TestBenchStorePrintsEveryRowWithItsRatio(t *testing.T) {
	var out, log bytes.Buffer
	b := storeBench{sizes: []int{100, 200}, requests: 3, dir: t.TempDir(), out: &out, log: &log}
	if err := b.run(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1+len(storeBenchRows) || !regexp.MustCompile(`100 runs +200 runs +200/100$`).MatchString(lines[0]) {
		t.Fatalf("table:\n%s", out.String())
	}
	row := regexp.MustCompile(`^(.+?) +\d+\.\d\d ms +\d+\.\d\d ms +\d+\.\d\d$`)
	for i, want := range storeBenchRows {
		if m := row.FindStringSubmatch(lines[i+1]); m == nil || m[1] != want {
			t.Errorf("row %d: %q, want %s with two latencies and a ratio", i, lines[i+1], want)
		}
	}
	if !strings.Contains(log.String(), "200 runs: the janitor purged 20 runs") {
		t.Errorf("log:\n%s", log.String())
	}
}
