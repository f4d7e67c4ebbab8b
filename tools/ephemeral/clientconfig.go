package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/tools/ephemeral/internal/client"
)

// clientSetting is a setting of the commands that call a daemon's API
// (ephemeral runs, ephemeral balance).
//
// They are not rows of hostd/config, the daemon's table: the daemon never
// reads them, ephemeral serve --print-config would list a client's API key
// among the daemon's settings, and a daemon's configuration file is no
// place for a member's key. The precedence rule is the same: flag, then
// environment variable, then default.
type clientSetting struct {
	name   string // the flag, without --
	env    string
	def    string
	usage  string
	secret bool // never printed
}

var clientSettings = []clientSetting{
	{name: "url", env: "EPHEMERAL_URL", def: "http://127.0.0.1:8080",
		usage: "the daemon's base URL, where ephemeral serve listens"},
	{name: "api-key", env: "EPHEMERAL_API_KEY", secret: true,
		usage: "a member's API key, eph_... (ephemeral admin key create); prefer the variable: other users can see a flag in ps"},
}

// clientFlags are the flags of every command that calls the API.
func clientFlags() []cli.Flag {
	var flags []cli.Flag
	for _, s := range clientSettings {
		usage := fmt.Sprintf("%s ($%s", s.usage, s.env)
		if s.def != "" {
			usage += "; default " + s.def
		}
		if s.secret {
			usage += "; never printed"
		}
		flags = append(flags, &cli.StringFlag{Name: s.name, Usage: usage + ")"})
	}
	return append(flags,
		&cli.BoolFlag{Name: "json", Usage: "print the API's objects as JSON, one a line, for scripts"},
		&cli.BoolFlag{Name: "verbose", Usage: "say on stderr what is sent (never the key): requests, Idempotency-Key, retries, reconnections"})
}

// clientSettingValues resolves the settings: a flag given on the command
// or on one above it (the innermost wins), else the environment variable,
// else the default.
func clientSettingValues(c *cli.Context, getenv func(string) (string, bool)) map[string]string {
	values := map[string]string{}
	for _, s := range clientSettings {
		values[s.name] = s.def
		if v, ok := getenv(s.env); ok && v != "" {
			values[s.name] = v
		}
		for _, ctx := range c.Lineage() {
			if ctx.IsSet(s.name) {
				values[s.name] = ctx.String(s.name)
				break
			}
		}
	}
	return values
}

// newClient builds the API client a command uses.
func newClient(c *cli.Context) (*client.Client, error) {
	values := clientSettingValues(c, os.LookupEnv)
	key := strings.TrimSpace(values["api-key"])
	if key == "" {
		return nil, fmt.Errorf("%s: no API key: set EPHEMERAL_API_KEY (or --api-key) to a member's key, %s...; "+
			"an administrator creates one with ephemeral admin key create --org ORG --member EMAIL", commandPath(c), auth.Prefix)
	}
	opts := client.Options{URL: values["url"], APIKey: key, UserAgent: "ephemeral-cli/" + readBuild().version}
	if c.Bool("verbose") {
		opts.Logf = func(format string, args ...any) {
			fmt.Fprintf(c.App.ErrWriter, "ephemeral: "+format+"\n", args...)
		}
	}
	cl, err := client.New(opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", commandPath(c), err)
	}
	return cl, nil
}
