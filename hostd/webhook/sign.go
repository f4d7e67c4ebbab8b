// Package webhook tells a client that its run has ended: it POSTs the run
// object to the URL the run named, signed with the organisation's secret,
// and retries with exponential backoff and jitter until the receiver
// answers 2xx or the attempts run out. Deliveries come from a durable
// outbox the store fills in the transaction that finishes the run, so a
// crash loses none; every attempt is recorded, the outcome goes on the
// run's timeline. Delivery is at least once: a receiver deduplicates by
// the Ephemeral-Webhook-Id header (the run id).
//
// The receiver's address passes the broker's policy (broker.CheckAddress:
// no loopback, private, link-local or metadata address, also in its IPv6
// forms), checked on the addresses the name resolves to, one of which is
// then dialled; redirects are not followed. Tests reach a receiver on
// loopback only through Config.Resolver and Config.UnsafeTestHooks.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Headers of a delivery.
const (
	// SignatureHeader carries "t=<unix seconds>,v1=<hex HMAC-SHA256 of
	// "<t>.<body>" under the secret>".
	SignatureHeader = "Ephemeral-Signature"
	// IDHeader is the run id: the same for every attempt of a delivery.
	IDHeader = "Ephemeral-Webhook-Id"
	// AttemptHeader counts the attempts, from 1.
	AttemptHeader = "Ephemeral-Webhook-Attempt"
)

// Sign returns the signature header's value for body sent at t.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return m.Sum(nil)
}

// ErrBadSignature is what Verify fails with.
var ErrBadSignature = errors.New("webhook: bad signature")

// Verify checks a delivery as a receiver should: the signature header must
// carry a v1 signature of body under secret, made at a time no further
// than tolerance from now (a replayed old delivery fails).
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	sent, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: no timestamp", ErrBadSignature)
	}
	if d := now.Sub(time.Unix(sent, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed %v from now, more than %v", ErrBadSignature, d.Round(time.Second), tolerance)
	}
	want := mac(secret, ts, body)
	for _, sig := range sigs {
		if hmac.Equal(sig, want) {
			return nil
		}
	}
	return ErrBadSignature
}
