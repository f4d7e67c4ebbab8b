package api

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/api/ratelimit"
)

// Rate is a token bucket: PerSecond requests a second on average, Burst
// at once. A zero PerSecond means no limit.
type Rate struct {
	PerSecond float64
	Burst     int
}

// Limits caps what one API key and one client address may ask of the API,
// so that no client can starve the others or burn the daemon's CPU. A
// client's address is the TCP peer's (a header such as X-Forwarded-For is
// anyone's to write), IPv6 addresses counted by /64 since one host
// commonly holds a whole one. Zero fields mean no limit.
type Limits struct {
	KeyRunCreations     Rate // POST /v1/runs per API key
	KeyReads            Rate // every other request per API key
	KeyStreams          int  // live event streams open at once per API key
	AddressRunCreations Rate
	// AddressReads counts every other request, including those without a
	// valid key, before the key is looked up.
	AddressReads   Rate
	AddressStreams int
}

// requestKind is what a request is counted as.
type requestKind int

const (
	runCreation requestKind = iota
	otherRequest
)

// limiter holds the buckets and slots of Limits; nil ones do not limit.
type limiter struct {
	perKey, perAddress         [2]*ratelimit.Buckets // by requestKind
	keyStreams, addressStreams *ratelimit.Slots
}

func newLimiter(l Limits) *limiter {
	buckets := func(r Rate) *ratelimit.Buckets {
		if r.PerSecond <= 0 {
			return nil
		}
		return ratelimit.NewBuckets(r.PerSecond, max(1, r.Burst))
	}
	slots := func(n int) *ratelimit.Slots {
		if n <= 0 {
			return nil
		}
		return ratelimit.NewSlots(n)
	}
	return &limiter{
		perKey:         [2]*ratelimit.Buckets{runCreation: buckets(l.KeyRunCreations), otherRequest: buckets(l.KeyReads)},
		perAddress:     [2]*ratelimit.Buckets{runCreation: buckets(l.AddressRunCreations), otherRequest: buckets(l.AddressReads)},
		keyStreams:     slots(l.KeyStreams),
		addressStreams: slots(l.AddressStreams),
	}
}

// take takes a token for client from b, or answers 429 and returns false.
// who says whose share ran out, for the message.
func take(w http.ResponseWriter, b *ratelimit.Buckets, client, who string) bool {
	if b == nil {
		return true
	}
	ok, wait := b.Take(client, time.Now())
	if !ok {
		retryAfter := max(1, int(math.Ceil(wait.Seconds())))
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: rateLimit, Code: "rate_limited",
			Message: fmt.Sprintf("too many requests from %s; retry after %d s", who, retryAfter)})
	}
	return ok
}

// acquire takes one of client's stream slots from s, or answers 429 and
// returns false. Call release when the stream ends.
func acquire(w http.ResponseWriter, s *ratelimit.Slots, client, who string) (release func(), ok bool) {
	if s == nil {
		return func() {}, true
	}
	release, ok = s.Acquire(client)
	if !ok {
		// Streams end when their runs do; a few seconds is a fair guess.
		w.Header().Set("Retry-After", "5")
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: rateLimit, Code: "too_many_streams",
			Message: fmt.Sprintf("%s has its maximum number of event streams open; close one first", who)})
	}
	return release, ok
}

// clientAddress is the client's address as limits count it (the TCP
// peer's, or the one a trusted proxy names: package forwarded set
// RemoteAddr): an IPv4 address, or the /64 an IPv6 address is in.
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap()
	if addr.Is4() {
		return addr.String()
	}
	prefix, _ := addr.WithZone("").Prefix(64) // cannot fail for an IPv6 address
	return prefix.String()
}
