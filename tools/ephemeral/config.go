package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/config"
)

// settingFlags are command-line flags for the named settings of the
// configuration table, or for all of them. They carry no defaults or
// environment variables of their own: config.Load applies those, so the
// precedence rule lives in one place.
func settingFlags(names ...string) []cli.Flag {
	var flags []cli.Flag
	for _, s := range config.Settings {
		if len(names) > 0 && !contains(names, s.Name) {
			continue
		}
		usage := fmt.Sprintf("%s (%s; $%s", s.Usage, s.Kind(), s.Env())
		if d := s.DefaultText(); d != "" {
			usage += "; default " + d
		}
		usage += ")"
		flags = append(flags, &cli.StringFlag{Name: s.Name, Usage: usage})
	}
	return flags
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// loadConfig resolves the configuration for a command: the settings given
// as flags on it or on any command above it (the innermost wins), then the
// environment, the configuration file and the defaults.
func loadConfig(c *cli.Context) (config.Loaded, error) {
	flags := map[string]string{}
	lineage := c.Lineage()
	for i := len(lineage) - 1; i >= 0; i-- {
		ctx := lineage[i]
		for _, name := range ctx.LocalFlagNames() {
			if _, ok := config.Lookup(name); ok {
				flags[name] = ctx.String(name)
			}
		}
	}
	return config.Load(config.Inputs{Flags: flags, Getenv: os.LookupEnv, ReadFile: os.ReadFile})
}
