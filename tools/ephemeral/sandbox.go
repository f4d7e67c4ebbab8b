package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/sandbox"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/vsockproto"
)

func sandboxCommand() *cli.Command {
	return &cli.Command{
		Name:  "sandbox",
		Usage: "run commands in disposable microVMs",
		Subcommands: []*cli.Command{{
			Name:      "exec",
			Usage:     "boot a fresh microVM, run one command in it as worker, destroy it",
			ArgsUsage: "[--] COMMAND [ARG...]",
			Description: "The command runs as user worker in /tmp/ephemeral-run-*/scratch; its stdout and\n" +
				"stderr stream separately and ephemeral exits with its exit code (128+N when\n" +
				"killed by signal N). Nothing it writes survives.",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "cpus", Value: 1, Usage: "guest vCPUs"},
				&cli.IntFlag{Name: "memory", Value: 512, Usage: "guest memory in MiB"},
				&cli.DurationFlag{Name: "timeout", Value: 5 * time.Minute, Usage: "kill the command after this long"},
				&cli.BoolFlag{Name: "shell", Usage: "run COMMAND as a bash -c script instead of an argv"},
				&cli.StringSliceFlag{Name: "env", Usage: "KEY=VALUE added to the command's environment"},
				&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "pass this terminal's stdin to the command"},
			},
			Action: sandboxExec,
		}},
	}
}

func sandboxExec(c *cli.Context) error {
	if err := requireRoot(c, vmsNeedRoot); err != nil {
		return err
	}
	args := c.Args().Slice()
	if len(args) == 0 {
		return cli.Exit("ephemeral sandbox exec: missing COMMAND (usage: ephemeral sandbox exec [flags] -- COMMAND [ARG...])", 2)
	}
	timeout := c.Duration("timeout")
	if timeout <= 0 {
		return cli.Exit(fmt.Sprintf("ephemeral sandbox exec: --timeout must be positive, got %v", timeout), 2)
	}
	req := vsockproto.ExecRequest{Argv: args, Env: c.StringSlice("env"), Timeout: timeout}
	if c.Bool("shell") {
		if len(args) != 1 {
			return cli.Exit("ephemeral sandbox exec: --shell takes exactly one script argument", 2)
		}
		req = vsockproto.ExecRequest{Shell: args[0], Env: req.Env, Timeout: timeout}
	}
	if err := req.Validate(); err != nil {
		return cli.Exit("ephemeral sandbox exec: "+err.Error(), 2)
	}

	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	loaded, err := loadConfig(c)
	if err != nil {
		return err
	}
	mgr, err := system.NewSandboxes(loaded.Config, "", stderrLog)
	if err != nil {
		return err
	}
	if _, err := mgr.Reconcile(ctx); err != nil {
		stderrLog.Warn("reconcile leftovers", "err", err)
	}
	sb, err := mgr.Create(ctx, sandbox.Options{VCPUs: c.Int("cpus"), MemoryMiB: c.Int("memory")})
	if err != nil {
		return err
	}
	defer sb.Destroy()

	var stdin *os.File // nil: the command reads EOF, as with docker exec without -i
	if c.Bool("interactive") {
		stdin = os.Stdin
	}
	st, err := sb.Exec(ctx, req, stdin, os.Stdout, os.Stderr)
	if derr := sb.Destroy(); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return cli.Exit("ephemeral sandbox exec: interrupted", 130)
		}
		return err
	}
	switch {
	case st.TimedOut:
		fmt.Fprintf(os.Stderr, "ephemeral: command timed out after %v and was killed\n", timeout)
		return cli.Exit("", 124)
	case st.ProcessLimit > 0:
		fmt.Fprintf(os.Stderr, "ephemeral: command tried to have more than %d processes and threads at once and was killed\n", st.ProcessLimit)
		return cli.Exit("", 128+st.Signal)
	case st.Signal != 0:
		return cli.Exit("", 128+st.Signal)
	case st.Code != 0:
		return cli.Exit("", st.Code)
	}
	return nil
}

// stderrLog is where commands that boot VMs without a daemon (sandbox
// exec, bench) log: warnings only, so their own output stays readable.
var stderrLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
