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
		// Repeated flags (--connection crm:GET,HEAD, --header 'X: a,b')
		// keep their commas.
		DisableSliceFlagSeparator: true,
		// Each command lives in its own file of this package.
		Commands: []*cli.Command{
			sandboxCommand(),
			benchCommand(),
			imageCommand,
			serveCommand, adminCommand,
			runCommand,
			runsCommand, balanceCommand,
		},
	}
	if err := app.Run(hoistFlags(os.Args, runsCommand, balanceCommand)); err != nil {
		// Errors quote the daemon and the API: make them printable.
		fmt.Fprintf(os.Stderr, "ephemeral: %s\n", printable(err.Error()))
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
