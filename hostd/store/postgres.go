package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// What is specific to PostgreSQL lives here: connecting through pgx, the
// placeholders, and which errors mean "try the transaction again".
//
// The store's SQL is written once, with SQLite's "?" and "?N" placeholders;
// connections to PostgreSQL rewrite them to "$N" (rebind) before pgx sees
// them. A statement that already uses "$N" placeholders — River's, which
// shares the connection pool so that a job is enqueued in the transaction
// that creates its run — is passed through untouched.

// postgresMaxConns bounds one daemon's connections: a node serves requests,
// its runs' timelines and River's workers from this pool.
const postgresMaxConns = 32

// IsPostgresURL reports whether a database setting names a PostgreSQL
// server rather than an SQLite state directory.
func IsPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// RedactURL returns the URL with its password replaced, fit for logs and
// error messages.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable database URL)"
	}
	return u.Redacted()
}

// OpenPostgres connects to the PostgreSQL database at databaseURL
// (postgres://user:password@host/db?sslmode=...) and brings its schema up
// to date. Many daemons may share the database.
func OpenPostgres(ctx context.Context, databaseURL string) (*Store, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		// pgx's error can quote the URL, password included.
		return nil, fmt.Errorf("store: parse PostgreSQL URL %s: invalid connection string", RedactURL(databaseURL))
	}
	db := sql.OpenDB(rebindConnector{stdlib.GetConnector(*cfg)})
	db.SetMaxOpenConns(postgresMaxConns)
	db.SetMaxIdleConns(postgresMaxConns)
	s := &Store{write: db, read: db, dialect: postgres, url: databaseURL}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: connect to %s: %w", RedactURL(databaseURL), err)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrate %s: %w", RedactURL(databaseURL), err)
	}
	return s, nil
}

// retryable reports whether a PostgreSQL transaction failed only because a
// concurrent one won (serialization failure, deadlock), so running it again
// is correct.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// rebind rewrites "?" and "?N" placeholders to PostgreSQL's "$N", leaving
// string literals, quoted identifiers and comments alone. A query that has
// "$N" placeholders already is returned as it is.
func rebind(query string) string {
	if !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	next := 1
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '\'' || c == '"':
			end := strings.IndexByte(query[i+1:], c)
			if end < 0 {
				b.WriteString(query[i:])
				return b.String()
			}
			b.WriteString(query[i : i+end+2])
			i += end + 1
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			end := strings.IndexByte(query[i:], '\n')
			if end < 0 {
				b.WriteString(query[i:])
				return b.String()
			}
			b.WriteString(query[i : i+end])
			i += end - 1
		case c == '$' && i+1 < len(query) && query[i+1] >= '0' && query[i+1] <= '9':
			return query // written for PostgreSQL already
		case c == '?':
			j := i + 1
			for j < len(query) && query[j] >= '0' && query[j] <= '9' {
				j++
			}
			b.WriteByte('$')
			if j > i+1 {
				b.WriteString(query[i+1 : j])
			} else {
				fmt.Fprintf(&b, "%d", next)
				next++
			}
			i = j - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// rebindConnector hands out pgx connections that rebind every statement.
type rebindConnector struct{ driver.Connector }

func (c rebindConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &rebindConn{conn.(*stdlib.Conn)}, nil
}

// rebindConn is a pgx connection whose statements are rebound first; every
// other method is pgx's own.
type rebindConn struct{ *stdlib.Conn }

func (c *rebindConn) Prepare(query string) (driver.Stmt, error) {
	return c.Conn.Prepare(rebind(query))
}

func (c *rebindConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, rebind(query))
}

func (c *rebindConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, rebind(query), storableText(args))
}

func (c *rebindConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, rebind(query), storableText(args))
}

// storableText makes every string argument one PostgreSQL's text can hold:
// it refuses NUL bytes and invalid UTF-8, which SQLite stores as given. A
// model's command or a guest's output may hold either; refusing them would
// fail the run's timeline, so each such byte becomes U+FFFD, as JSON
// encoding does with invalid UTF-8. Bytes meant to stay bytes travel as
// []byte (bytea) and are left alone.
func storableText(args []driver.NamedValue) []driver.NamedValue {
	for i, a := range args {
		if s, ok := a.Value.(string); ok && (!utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0) {
			args[i].Value = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
		}
	}
	return args
}

// Channels a PostgreSQL database announces changes on (see migration
// 0007): the payload is a run id.
const (
	// TimelineChannel: the run's timeline or status changed.
	TimelineChannel = "ephemeral_timeline"
	// CancelChannel: someone asked to cancel the run.
	CancelChannel = "ephemeral_cancel"
)

// Listen calls fn with each notification on channels until ctx ends, on a
// connection of its own. After connecting, and again after every
// reconnect, it calls fn with an empty channel: notifications may have
// been missed meanwhile, so whoever waits should look again. A lost
// connection is reported to onError and tried again a second later.
func (s *Store) Listen(ctx context.Context, channels []string, fn func(channel, payload string), onError func(error)) {
	if s.dialect != postgres {
		return // one daemon: its own hub hears every change
	}
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, channels, fn)
		if ctx.Err() != nil {
			return
		}
		onError(err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

func (s *Store) listenOnce(ctx context.Context, channels []string, fn func(channel, payload string)) error {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return fmt.Errorf("store: listen: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("store: listen on %s: %w", ch, err)
		}
	}
	fn("", "")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("store: wait for notifications: %w", err)
		}
		fn(n.Channel, n.Payload)
	}
}

// SchemaLocked runs fn while holding, on PostgreSQL, a lock that one
// node at a time can hold (SQLite serves one daemon: fn just runs), so
// that another component's schema (the job queue's, whose migrations each
// need a transaction of their own) is created by one node at a time.
func (s *Store) SchemaLocked(ctx context.Context, fn func() error) error {
	if s.dialect != postgres {
		return fn()
	}
	conn, err := s.write.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: connection for the schema lock: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(`+schemaLock+`)`); err != nil {
		return fmt.Errorf("store: take the schema lock: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+schemaLock+`)`)
	return fn()
}

// schemaLock is the advisory lock key of SchemaLocked ("ephs").
const schemaLock = "1701865587"
