package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/system"
)

var serveCommand = &cli.Command{
	Name:  "serve",
	Usage: "serve the runs API (POST /v1/runs) on a local address",
	Description: "Every setting comes from its flag, else its EPHEMERAL_* environment variable, else the JSON\n" +
		"file named by --config (keys are the setting names, e.g. {\"listen\": \"127.0.0.1:9000\",\n" +
		"\"retention\": \"720h\", \"max-cost-micros\": 100000000}), else its default.\n" +
		"--print-config shows the result and where each value came from.",
	Flags: append(settingFlags(), &cli.BoolFlag{Name: "print-config",
		Usage: "print the effective configuration (secrets redacted) and where each value came from, then exit"}),
	Action: serve,
}

func serve(c *cli.Context) error {
	loaded, err := loadConfig(c)
	if err != nil {
		return err
	}
	if c.Bool("print-config") {
		return loaded.Print(c.App.Writer)
	}
	if err := requireRoot(c, vmsNeedRoot); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	sys, err := system.New(ctx, loaded.Config, system.Options{Logger: log})
	if err != nil {
		return err
	}
	defer sys.Close()
	sys.Announce = c.App.Writer
	sys.LogModels()
	if err := sys.Start(ctx); err != nil {
		return err
	}
	return sys.Serve(ctx)
}
