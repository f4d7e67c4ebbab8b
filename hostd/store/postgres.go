package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"

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
	return c.Conn.ExecContext(ctx, rebind(query), args)
}

func (c *rebindConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, rebind(query), args)
}
