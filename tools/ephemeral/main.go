// Command ephemeral is the command-line interface of Ephemeral: it builds
// the guest image, runs commands in disposable microVMs, benchmarks boots and
// serves the runs API.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// defaultStateDir holds images, per-VM directories and the database.
const defaultStateDir = "/var/lib/ephemeral"

var stateDirFlag = &cli.StringFlag{
	Name:    "state-dir",
	Usage:   "directory for images, VM state and the database",
	Value:   defaultStateDir,
	EnvVars: []string{"EPHEMERAL_STATE_DIR"},
}

func main() {
	app := &cli.App{
		Name:                 "ephemeral",
		Usage:                "run untrusted, AI-written code in disposable microVMs",
		Flags:                []cli.Flag{stateDirFlag},
		EnableBashCompletion: true,
		// Each command lives in its own file of this package.
		Commands: []*cli.Command{
			sandboxCommand(),
			benchCommand(),
			imageCommand,
			serveCommand, adminCommand,
			runCommand,
		},
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "ephemeral: %v\n", err)
		os.Exit(exitCode(err))
	}
}

// exitCode lets a command choose the process exit status (sandbox exec
// passes on the guest command's code) by returning a cli.ExitCoder.
func exitCode(err error) int {
	if ec, ok := err.(cli.ExitCoder); ok {
		return ec.ExitCode()
	}
	return 1
}
