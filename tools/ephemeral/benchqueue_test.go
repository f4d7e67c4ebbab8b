package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/testenv"
)

// A small run of `ephemeral bench queue` measures every row on SQLite,
// one PostgreSQL node and two, and on both backends with each history,
// and prints both tables with their ratios. Its throwaway PostgreSQL
// cluster runs as the postgres user, which only root can switch to.
func TestBenchQueuePrintsEveryRowWithItsRatio(t *testing.T) {
	testenv.RequireRoot(t)
	var out bytes.Buffer
	var log testenv.SyncBuffer // the daemons log from their goroutines
	b := queueBench{runs: 20, history: []int{100, 200}, nodes: 2, clients: 4, capacity: 4, sleep: time.Millisecond,
		dir: t.TempDir(), out: &out, log: &log}
	if err := b.run(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	lines := strings.Split(out.String(), "\n")
	find := func(header *regexp.Regexp) int {
		for i, l := range lines {
			if header.MatchString(l) {
				return i
			}
		}
		t.Fatalf("no line matches %s in:\n%s", header, out.String())
		return 0
	}
	value := `(\d+\.\d\d ms|\d+\.\d/s|\d+)`
	ratio := `(\d+\.\d\d|—)`
	first := find(regexp.MustCompile(`^no history +SQLite +PG 1 node +PG 2 nodes +PG/SQLite +2 nodes/1$`))
	row := regexp.MustCompile(`^(.+?) +` + value + ` +` + value + ` +` + value + ` +` + ratio + ` +` + ratio + `$`)
	for i, want := range queueBenchRows {
		if m := row.FindStringSubmatch(lines[first+1+i]); m == nil || m[1] != want {
			t.Errorf("row %d: %q, want %s with three figures and two ratios", i, lines[first+1+i], want)
		}
	}
	second := find(regexp.MustCompile(`^with a history of +100 runs +200 runs +200/100$`))
	row = regexp.MustCompile(`^(.+?) +` + value + ` +` + value + ` +` + ratio + `$`)
	for i, want := range queueHistoryRows {
		if m := row.FindStringSubmatch(lines[second+1+i]); m == nil || m[1] != want {
			t.Errorf("history row %d: %q, want %s with two figures and a ratio", i, lines[second+1+i], want)
		}
	}
	for _, want := range []string{"SQLite: 200 finished runs written", "PostgreSQL, 1 node(s): 200 finished runs written"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	if t.Failed() {
		t.Logf("table:\n%s", out.String())
	}
}
