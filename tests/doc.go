// Package tests holds Ephemeral's end-to-end tests: they boot real microVMs
// from the project's guest image with the machine's own VMM and check what a
// user would check. They need root and a built image (`make image`); without
// them they skip with the command to run, unless EPHEMERAL_REQUIRE_VM=1 (set
// by `make test` and CI), where a missing prerequisite is a failure.
package tests
