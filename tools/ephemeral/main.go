// Command ephemeral is the command-line interface of Ephemeral: it builds
// the guest image, runs commands in disposable microVMs, benchmarks boots and
// serves the runs API.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

func main() {
	cli.VersionPrinter = printVersion
	app := &cli.App{
		Name:    "ephemeral",
		Usage:   "run untrusted, AI-written code in disposable microVMs",
		Version: readBuild().version,
		// Every command reads the configuration (see hostd/config);
		// these two settings may also come before the command.
		Flags:                settingFlags("config", "state-dir"),
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
