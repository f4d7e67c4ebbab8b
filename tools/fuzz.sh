#!/usr/bin/env bash
# Runs every fuzz target in the repository (each `func Fuzz...` in a
# _test.go file), one after another for FUZZTIME each: go test -fuzz takes
# one target of one package at a time. Seeds in testdata/fuzz run first.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context
# deadline exceeded" when -fuzztime ends while a worker is busy on a loaded
# machine (go.dev/issue/75804, fixed in Go 1.27): no input is written and
# nothing is found. Such a run is tried again, three times in all; a
# failure that wrote an input, or any other failure, fails at once.
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20s}

fuzz_once() { # target dir logfile
	$GO test -run '^$' -fuzz "^$1\$" -fuzztime "$FUZZTIME" "$2" 2>&1 | tee "$3"
	return "${PIPESTATUS[0]}"
}

deadline_flake() { # logfile
	grep -q 'context deadline exceeded' "$1" && ! grep -q 'Failing input written to' "$1" &&
		! grep -qE '^\s+(panic|.*_test\.go:[0-9]+:)' "$1"
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for file in $(grep -rl --include='*_test.go' --exclude-dir=.git '^func Fuzz' .); do
	for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
		dir=$(dirname "$file")
		echo "fuzz: $target in $dir for $FUZZTIME"
		for attempt in 1 2 3; do
			if fuzz_once "$target" "$dir" "$log"; then
				continue 2
			fi
			if ! deadline_flake "$log"; then
				break
			fi
			echo "fuzz: $target: the coordinator's deadline race (go.dev/issue/75804), no input found (attempt $attempt of 3)"
		done
		echo "fuzz: $target in $dir failed" >&2
		exit 1
	done
done
