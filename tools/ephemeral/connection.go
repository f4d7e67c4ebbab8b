package main

import (
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/connections"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
)

// connectionCommand is `ephemeral admin connection`: an organisation's
// connections, with their secret headers sealed by the state directory's
// key (or the secret-key setting).
var connectionCommand = &cli.Command{
	Name:  "connection",
	Usage: "an organisation's connections to outside HTTP systems (credentials stay on the host)",
	Subcommands: []*cli.Command{
		{
			Name:  "add",
			Usage: "register a connection runs can be granted",
			Description: "Example: ephemeral admin connection add --org acme --name crm --base-url https://crm.example.com/api " +
				"--header 'Authorization: Bearer ...' --methods GET,HEAD",
			Flags: []cli.Flag{
				orgFlag,
				&cli.StringFlag{Name: "name", Usage: "connection name, used in http://connections.internal/<name>/", Required: true},
				&cli.StringFlag{Name: "base-url", Usage: "https URL every call goes under", Required: true},
				&cli.StringSliceFlag{Name: "header", Usage: "'Name: value' the broker adds to every call (repeatable; stored encrypted)"},
				&cli.StringFlag{Name: "methods", Usage: "the most a run may be granted, e.g. GET,HEAD", Value: "GET,HEAD"},
			},
			Action: withRegistry(func(c *cli.Context, st *store.Store, reg *connections.Registry) error {
				o, err := findOrg(c, st)
				if err != nil {
					return err
				}
				base, err := connections.ParseBaseURL(c.String("base-url"), false)
				if err != nil {
					return err
				}
				methods, err := connections.ParseMethods(c.String("methods"))
				if err != nil {
					return err
				}
				headers := http.Header{}
				for _, h := range c.StringSlice("header") {
					name, value, err := connections.ParseHeader(h)
					if err != nil {
						return err
					}
					headers.Add(name, value)
				}
				conn := connections.Connection{Name: c.String("name"), BaseURL: base, Methods: methods, Headers: headers}
				if err := reg.Add(c.Context, o.ID, conn); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "added connection %s to %s: %s, %s, %d header(s) stored encrypted\n",
					conn.Name, o.Name, base, strings.Join(methods, ","), len(headers))
				return nil
			}),
		},
		{
			Name: "list", Usage: "list an organisation's connections (header names only, never values)",
			Flags: []cli.Flag{orgFlag},
			Action: withRegistry(func(c *cli.Context, st *store.Store, reg *connections.Registry) error {
				o, err := findOrg(c, st)
				if err != nil {
					return err
				}
				list, err := reg.List(c.Context, o.ID)
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tBASE URL\tMETHODS\tHEADERS")
				for _, s := range list {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", s.Name, s.BaseURL, strings.Join(s.Methods, ","), strings.Join(s.HeaderNames, ","))
				}
				return w.Flush()
			}),
		},
		{
			Name: "remove", Usage: "remove a connection; runs started later cannot use it",
			Flags: []cli.Flag{orgFlag, &cli.StringFlag{Name: "name", Required: true}},
			Action: withRegistry(func(c *cli.Context, st *store.Store, reg *connections.Registry) error {
				o, err := findOrg(c, st)
				if err != nil {
					return err
				}
				if err := reg.Remove(c.Context, o.ID, c.String("name")); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "removed connection %s from %s\n", c.String("name"), o.Name)
				return nil
			}),
		},
	},
}

// withRegistry opens the database and the connection registry, whose
// secrets are sealed with the configured key, for one command.
func withRegistry(action func(*cli.Context, *store.Store, *connections.Registry) error) cli.ActionFunc {
	return withSystem(func(c *cli.Context, sys *system.System) error {
		return action(c, sys.Store, sys.Connections)
	})
}
