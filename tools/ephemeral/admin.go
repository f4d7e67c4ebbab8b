package main

import (
	"errors"
	"fmt"
	"io"
	"net/mail"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/examplecrm"
	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
)

var orgFlag = &cli.StringFlag{Name: "org", Usage: "organisation name", Required: true}

var adminCommand = &cli.Command{
	Name:  "admin",
	Usage: "manage organisations, members, API keys, balances, connections and webhook secrets in the daemon's database, and move it to PostgreSQL",
	Subcommands: []*cli.Command{
		connectionCommand,
		migrateCommand,
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
					if errors.Is(err, store.ErrExists) {
						return fmt.Errorf("organisation %q already exists", name)
					}
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "created organisation %s (%s)\n", o.Name, o.ID)
					if c.Bool("no-examples") {
						return nil
					}
					if err := sys.ProvisionOrg(c.Context, o.ID); err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "added example connection %s (read-only, served by the daemon)\n", examplecrm.Name)
					return nil
				}),
			}, {
				Name: "list", Usage: "list the organisations",
				Action: withStore(func(c *cli.Context, st *store.Store) error {
					w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "NAME\tID\tCREATED")
					// A page at a time, so no statement reads every
					// organisation at once.
					for after := ""; ; {
						orgs, more, err := st.OrgsPage(c.Context, after, 100)
						if err != nil {
							return err
						}
						for _, o := range orgs {
							fmt.Fprintf(w, "%s\t%s\t%s\n", o.Name, o.ID, formatTime(&o.CreatedAt))
						}
						if !more {
							break
						}
						after = orgs[len(orgs)-1].Name
					}
					return w.Flush()
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
					if err := checkMemberEmail(email); err != nil {
						return err
					}
					o, err := findOrg(c, st)
					if err != nil {
						return err
					}
					m, err := st.AddMember(c.Context, o.ID, email)
					if errors.Is(err, store.ErrExists) {
						return fmt.Errorf("%s is a member of %s already", email, o.Name)
					}
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "added %s to %s (%s)\n", m.Email, o.Name, m.ID)
					return nil
				}),
			}, {
				Name: "list", Usage: "list an organisation's members", Flags: []cli.Flag{orgFlag},
				Action: withStore(func(c *cli.Context, st *store.Store) error {
					o, err := findOrg(c, st)
					if err != nil {
						return err
					}
					members, err := st.Members(c.Context, o.ID)
					if err != nil {
						return err
					}
					w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "EMAIL\tID\tADDED")
					for _, m := range members {
						fmt.Fprintf(w, "%s\t%s\t%s\n", m.Email, m.ID, formatTime(&m.CreatedAt))
					}
					return w.Flush()
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
						o, err := findOrg(c, st)
						if err != nil {
							return err
						}
						m, err := st.MemberByEmail(c.Context, o.ID, c.String("member"))
						if errors.Is(err, store.ErrNotFound) {
							return fmt.Errorf("%s is no member of %s (ephemeral admin member list --org %s shows them)", c.String("member"), o.Name, o.Name)
						}
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
					Name: "list", Usage: "list an organisation's API keys, newest first: id, member, created, last used (to the minute), revoked",
					Flags: []cli.Flag{orgFlag, &cli.StringFlag{Name: "member", Usage: "only this member's keys"}},
					Action: withStore(func(c *cli.Context, st *store.Store) error {
						o, err := findOrg(c, st)
						if err != nil {
							return err
						}
						keys, err := st.Keys(c.Context, o.ID)
						if err != nil {
							return err
						}
						w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
						fmt.Fprintln(w, "KEY\tMEMBER\tCREATED\tLAST USED\tREVOKED")
						for _, k := range keys {
							if member := c.String("member"); member != "" && k.MemberEmail != member {
								continue
							}
							revoked := "-"
							if k.RevokedAt != nil {
								revoked = formatTime(k.RevokedAt)
							}
							// The key's public part, as it begins every
							// key: enough to recognise one, never a secret.
							fmt.Fprintf(w, "%s%s_…\t%s\t%s\t%s\t%s\n", auth.Prefix, k.ID, k.MemberEmail,
								formatTime(&k.CreatedAt), formatTime(k.LastUsedAt), revoked)
						}
						return w.Flush()
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
				o, err := findOrg(c, st)
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
		{
			Name: "balance", Usage: "an organisation's balance",
			Subcommands: []*cli.Command{{
				Name: "show", Usage: "print what is available, held by active runs, charged and credited in all",
				Flags: []cli.Flag{orgFlag},
				Action: withStore(func(c *cli.Context, st *store.Store) error {
					o, err := findOrg(c, st)
					if err != nil {
						return err
					}
					a, err := st.Balance(c.Context, o.ID)
					if err != nil {
						return err
					}
					printBalance(c.App.Writer, a)
					return nil
				}),
			}},
		},
	},
}

// printBalance prints an account one amount a line, as dollars and as the
// integer micro-dollars the API uses.
func printBalance(w io.Writer, a ledger.Account) {
	for _, row := range []struct {
		name   string
		micros int64
	}{{"available", a.Available}, {"held", a.Held}, {"charged", a.Charged}, {"credited", a.Credited}} {
		fmt.Fprintf(w, "%-9s  %14s  %16s\n", row.name, money.Format(row.micros), fmt.Sprintf("%d micros", row.micros))
	}
}

// maxEmailBytes is the longest address SMTP can carry (RFC 5321: a path of
// 256 bytes with its angle brackets).
const maxEmailBytes = 254

// checkMemberEmail accepts a bare address (dev@acme.example) only: no
// display name ("Dev <dev@acme.example>"), comment or surrounding space,
// since the address is what keys are created for and looked up by.
func checkMemberEmail(email string) error {
	if len(email) > maxEmailBytes {
		return fmt.Errorf("member email is %d bytes; an address has at most %d", len(email), maxEmailBytes)
	}
	addr, err := mail.ParseAddress(email)
	domain := email[strings.LastIndex(email, "@")+1:]
	if err != nil || addr.Name != "" || addr.Address != email || !strings.Contains(domain, ".") {
		return fmt.Errorf("member email %q is not a plain address like dev@acme.example", email)
	}
	return nil
}

// findOrg loads the organisation named by --org.
func findOrg(c *cli.Context, st *store.Store) (store.Org, error) {
	name := c.String("org")
	o, err := st.OrgByName(c.Context, name)
	if errors.Is(err, store.ErrNotFound) {
		return store.Org{}, fmt.Errorf("no organisation %q (ephemeral admin org list shows them)", name)
	}
	return o, err
}

// formatTime prints a time to the second in UTC, or "never".
func formatTime(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
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
		if err := needStateDir(c, loaded.Config.StateDir); err != nil {
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
