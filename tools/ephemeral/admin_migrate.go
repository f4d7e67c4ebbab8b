package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/system"
	"github.com/ephemeralhq/ephemeral/internal/flock"
)

// migrateCommand is `ephemeral admin migrate`: moving an embedded install
// (one daemon, its SQLite database in the state directory) up to a shared
// PostgreSQL database that several daemons can serve.
var migrateCommand = &cli.Command{
	Name:  "migrate",
	Usage: "copy an embedded install's database into an empty PostgreSQL database, checking the money before and after",
	Description: "Stop the daemon of the install first and let its runs finish. Example:\n" +
		"ephemeral admin migrate --from /var/lib/ephemeral --to 'postgres://ephemeral:PASSWORD@db.internal/ephemeral'",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "from", Usage: "state directory of the embedded install (holding " +
			filepath.Base(system.DatabasePath("")) + ")", Required: true},
		&cli.StringFlag{Name: "to", Usage: "URL of the empty PostgreSQL database, postgres://user:password@host/database", Required: true},
	},
	Action: func(c *cli.Context) error {
		return migrateInstall(c.Context, c.App.Writer, c.String("from"), c.String("to"))
	},
}

// migrateInstall copies the SQLite database of the state directory from
// into the PostgreSQL database at to and prints what it copied. Messages
// show to only redacted: it carries the database password.
func migrateInstall(ctx context.Context, w io.Writer, from, to string) error {
	if !store.IsPostgresURL(to) {
		return fmt.Errorf("--to %s is not a PostgreSQL URL: give postgres://user:password@host/database", store.RedactURL(to))
	}
	dbPath, err := embeddedDatabase(from)
	if err != nil {
		return err
	}
	unlock, err := lockIdleStateDir(from)
	if err != nil {
		return err
	}
	defer unlock()
	src, err := store.Open(ctx, dbPath)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := store.OpenPostgres(ctx, to)
	if err != nil {
		return err
	}
	defer dst.Close()
	fmt.Fprintf(w, "copying %s into %s\n", dbPath, store.RedactURL(to))
	rep, err := store.Copy(ctx, src, dst)
	if err != nil {
		return fmt.Errorf("migrate %s to %s: %w", from, store.RedactURL(to), err)
	}
	fmt.Fprint(w, rep)
	printSecretKeyReminder(w, from)
	return nil
}

// embeddedDatabase returns the path of the database in the state
// directory dir, refusing a directory that has none: opening it would
// create an empty one and copy nothing.
func embeddedDatabase(dir string) (string, error) {
	path := system.DatabasePath(dir)
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("--from %s holds no database (no %s): give the state directory of the install to move", dir, path)
	}
	if err != nil {
		return "", fmt.Errorf("--from %s: %w", dir, err)
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("--from %s: %s is not a database file", dir, path)
	}
	return path, nil
}

// lockIdleStateDir takes the state directory's daemon lock for as long as
// the copy runs, as a daemon serving the directory does (hostd/system),
// so that a daemon running now is refused and none starts meanwhile: runs
// it made after the copy read the database would be lost.
func lockIdleStateDir(dir string) (unlock func(), err error) {
	f, err := flock.TryLock(filepath.Join(dir, "daemon.lock"), flock.Exclusive)
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("a daemon is running on %s: stop it first", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// printSecretKeyReminder says what the nodes of the new database need
// besides its URL: the install's secret key, which sealed the connection
// secrets and webhook secrets now copied; a node with another key cannot
// open them.
func printSecretKeyReminder(w io.Writer, stateDir string) {
	setting, _ := config.Lookup("secret-key")
	keyFile := filepath.Join(stateDir, seal.KeyFile)
	fmt.Fprintln(w, "Every node serving this database needs this install's secret key: connection secrets and webhook secrets are sealed with it.")
	if _, err := os.Stat(keyFile); err == nil {
		fmt.Fprintf(w, "Copy %s into each node's state directory, or set secret-key ($%s) on every node to its 64 hex digits.\n",
			keyFile, setting.Env())
		return
	}
	fmt.Fprintf(w, "This install has no %s: set every node's secret-key ($%s) to the one it was configured with.\n", keyFile, setting.Env())
}
