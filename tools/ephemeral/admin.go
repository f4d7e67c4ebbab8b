package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
)

var orgFlag = &cli.StringFlag{Name: "org", Usage: "organisation name", Required: true}

var adminCommand = &cli.Command{
	Name:  "admin",
	Usage: "manage organisations, members, API keys, balances, connections and webhook secrets in the daemon's database",
	Subcommands: []*cli.Command{
		connectionCommand,
		{
			Name: "webhook-secret", Usage: "the secret an organisation's webhook deliveries are signed with",
			Subcommands: []*cli.Command{{
				Name:  "rotate",
				Usage: "make the organisation a new webhook secret, replacing the old one for every delivery from now on; it is printed once",
				Flags: []cli.Flag{orgFlag},
				Action: withSystem(func(c *cli.Context, sys *system.System) error {
					o, err := sys.Store.OrgByName(c.Context, c.String("org"))
					if err != nil {
						return err
					}
					secret, _, err := sys.WebhookSecrets.Rotate(c.Context, o.ID)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.ErrWriter, "new webhook secret for %s; deliveries are signed with it from now on; store it now, it is not shown again:\n", o.Name)
					fmt.Fprintln(c.App.Writer, secret)
					return nil
				}),
			}},
		},
		{
			Name: "org", Usage: "organisations",
			Subcommands: []*cli.Command{{
				Name: "create", Usage: "create an organisation (with the example connection)", ArgsUsage: "NAME",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "no-examples", Usage: "do not register the example connection"}},
				Action: withSystem(func(c *cli.Context, sys *system.System) error {
					name, err := oneArg(c, "NAME")
					if err != nil {
						return err
					}
					o, err := sys.Store.CreateOrg(c.Context, name)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "created organisation %s (%s)\n", o.Name, o.ID)
					if c.Bool("no-examples") {
						return nil
					}
					return addExampleConnection(c, sys.Connections, o)
				}),
			}},
		},
		{
			Name: "member", Usage: "members of an organisation",
			Subcommands: []*cli.Command{{
				Name: "add", Usage: "add a member", ArgsUsage: "EMAIL", Flags: []cli.Flag{orgFlag},
				Action: withStore(func(c *cli.Context, st *store.Store) error {
					email, err := oneArg(c, "EMAIL")
					if err != nil {
						return err
					}
					o, err := st.OrgByName(c.Context, c.String("org"))
					if err != nil {
						return err
					}
					m, err := st.AddMember(c.Context, o.ID, email)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "added %s to %s (%s)\n", m.Email, o.Name, m.ID)
					return nil
				}),
			}},
		},
		{
			Name: "key", Usage: "API keys",
			Subcommands: []*cli.Command{
				{
					Name: "create", Usage: "create a member's API key; it is printed once",
					Flags: []cli.Flag{orgFlag, &cli.StringFlag{Name: "member", Usage: "member email", Required: true}},
					Action: withStore(func(c *cli.Context, st *store.Store) error {
						o, err := st.OrgByName(c.Context, c.String("org"))
						if err != nil {
							return err
						}
						m, err := st.MemberByEmail(c.Context, o.ID, c.String("member"))
						if err != nil {
							return err
						}
						k := auth.NewKey()
						if err := st.AddKey(c.Context, m, k.ID, k.Hash); err != nil {
							return err
						}
						fmt.Fprintf(c.App.ErrWriter, "key id %s for %s in %s; store the key now, it is not shown again:\n", k.ID, m.Email, o.Name)
						fmt.Fprintln(c.App.Writer, k.Secret)
						return nil
					}),
				},
				{
					Name: "revoke", Usage: "revoke a key by its id", ArgsUsage: "KEY_ID",
					Action: withStore(func(c *cli.Context, st *store.Store) error {
						id, err := oneArg(c, "KEY_ID")
						if err != nil {
							return err
						}
						if err := st.RevokeKey(c.Context, id); err != nil {
							return err
						}
						fmt.Fprintf(c.App.Writer, "revoked key %s\n", id)
						return nil
					}),
				},
			},
		},
		{
			Name: "credit", Usage: "add money to an organisation's balance",
			Flags: []cli.Flag{orgFlag, &cli.Int64Flag{Name: "micros", Usage: "amount in micro-dollars (1000000 = $1)", Required: true}},
			Action: withStore(func(c *cli.Context, st *store.Store) error {
				o, err := st.OrgByName(c.Context, c.String("org"))
				if err != nil {
					return err
				}
				a, err := st.Credit(c.Context, o.ID, c.Int64("micros"))
				if err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "credited %s to %s: available %s, held %s\n",
					money.Format(c.Int64("micros")), o.Name, money.Format(a.Available), money.Format(a.Held))
				return nil
			}),
		},
	},
}

// withStore opens the daemon's database for one admin command. SQLite's WAL
// and busy timeout let this run while `ephemeral serve` is up.
func withStore(action func(*cli.Context, *store.Store) error) cli.ActionFunc {
	return withSystem(func(c *cli.Context, sys *system.System) error { return action(c, sys.Store) })
}

// withSystem opens the daemon's database and connection registry (the
// parts admin commands use) for one command.
func withSystem(action func(*cli.Context, *system.System) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		loaded, err := loadConfig(c)
		if err != nil {
			return err
		}
		sys, err := system.OpenStore(c.Context, loaded.Config, nil)
		if err != nil {
			return err
		}
		defer sys.Close()
		return action(c, sys)
	}
}

func oneArg(c *cli.Context, name string) (string, error) {
	if c.NArg() != 1 || c.Args().First() == "" {
		return "", fmt.Errorf("%s: expected exactly one argument %s", c.Command.FullName(), name)
	}
	return c.Args().First(), nil
}
