package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/webhook"
)

// verify is what a receiver writes (the README shows it): it needs
// nothing of Ephemeral's, only the secret and the request as received.
func verify(secret, header string, body []byte, now time.Time) bool {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sent, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(sent, 0)).Abs() > 5*time.Minute {
		return false // no timestamp, or a replay of an old delivery
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, s := range sigs {
		if got, err := hex.DecodeString(s); err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

// A receiver checks the Ephemeral-Signature header of each delivery
// against the raw body, before parsing it.
func Example_receiver() {
	secret := "whsec_0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab"
	body := []byte(`{"id":"run_4f0c...","object":"run","status":"succeeded"}`)
	now := time.Now()
	header := webhook.Sign(secret, now, body)

	fmt.Println(verify(secret, header, body, now))
	fmt.Println(verify(secret, header, []byte(`{"status":"failed"}`), now))
	fmt.Println(verify(secret, header, body, now.Add(time.Hour)))
	// Output:
	// true
	// false
	// false
}
