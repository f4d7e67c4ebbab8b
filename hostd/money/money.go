// Package money formats the integer micro-dollar amounts used everywhere in
// Ephemeral the way the product page shows them ("$0.04", "$0.00353").
package money

import (
	"strconv"
	"strings"
)

// MicrosPerDollar is the number of micro-dollars in one US dollar.
const MicrosPerDollar = 1_000_000

// Format renders micros as dollars with trailing zeros trimmed but never fewer
// than two decimals, so "$0.04" and "$0.00353" read as on the product page
// while no micro-dollar is ever rounded away.
func Format(micros int64) string {
	sign := ""
	// Work on the unsigned magnitude so the most negative int64 does not overflow.
	mag := uint64(micros)
	if micros < 0 {
		sign = "-"
		mag = -mag
	}
	dollars := mag / MicrosPerDollar
	frac := strconv.FormatUint(mag%MicrosPerDollar+MicrosPerDollar, 10)[1:] // zero-padded to 6 digits
	frac = strings.TrimRight(frac, "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return sign + "$" + Count(int64(dollars)) + "." + frac
}

// Count renders a non-negative count with thousands separators ("5,214").
func Count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	head := len(s) % 3
	if head == 0 {
		head = 3
	}
	b.WriteString(s[:head])
	for i := head; i < len(s); i += 3 {
		b.WriteByte(',')
		b.WriteString(s[i : i+3])
	}
	return b.String()
}
