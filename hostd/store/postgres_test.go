package store

import "testing"

func TestRebindRewritesOnlyPlaceholders(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`SELECT a FROM t WHERE b = ? AND c = ?`, `SELECT a FROM t WHERE b = $1 AND c = $2`},
		{`UPDATE t SET a = ?1, b = ?1 + ?2 WHERE id = ?3`, `UPDATE t SET a = $1, b = $1 + $2 WHERE id = $3`},
		// Inside literals, quoted names and comments a ? is text.
		{`SELECT '?', "a?b", x FROM t WHERE y = ? -- what?` + "\n" + `AND z = ?`, `SELECT '?', "a?b", x FROM t WHERE y = $1 -- what?` + "\n" + `AND z = $2`},
		{`SELECT 'it''s ?' WHERE a = ?`, `SELECT 'it''s ?' WHERE a = $1`},
		// Written for PostgreSQL already (River's): left alone, even the
		// jsonb operator.
		{`SELECT * FROM river_job WHERE metadata ? 'k' AND id = $1`, `SELECT * FROM river_job WHERE metadata ? 'k' AND id = $1`},
		// Unterminated: copied as it is, for the server to refuse.
		{`SELECT 'open ? `, `SELECT 'open ? `},
	} {
		if got := rebind(tc.in); got != tc.want {
			t.Errorf("rebind(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}
