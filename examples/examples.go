// Package examples ships the examples the web app lists, shows and
// replays, compiled into the binary: one JSON document each, in the format
// package hostd/example reads. `ephemeral run --replay examples/NAME.json`
// replays one from the command line.
package examples

import "embed"

// Files holds every example document.
//
//go:embed *.json
var Files embed.FS
