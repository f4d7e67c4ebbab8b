package broker

import (
	"testing"
)

func TestEventMessages(t *testing.T) {
	for _, c := range []struct {
		e    Event
		want string
	}{
		{Event{Method: "GET", Host: "example.com", Status: 200, Bytes: 12_345}, "GET example.com → 200, 12 KB"},
		{Event{Method: "GET", Host: "example.com:8080", Status: 404, Bytes: 9}, "GET example.com:8080 → 404, 9 B"},
		{Event{Method: "CONNECT", Host: "pypi.org", Status: 200, Bytes: 3_400_000}, "CONNECT pypi.org → 200, 3.4 MB"},
		{Event{Connection: "crm", Method: "GET", Path: "/v1/customers", Status: 200, Bytes: 512}, "GET crm /v1/customers → 200"},
		{Event{Connection: "crm", Method: "POST", Path: "/v1/customers", Status: 403, Refused: "method POST is not granted"},
			"POST crm /v1/customers → 403 refused: method POST is not granted"},
		{Event{Method: "GET", Host: "big.test", Status: 200, Bytes: 1000, Err: "response body exceeds the broker's limit"},
			"GET big.test → 200, 1 KB, failed: response body exceeds the broker's limit"},
	} {
		if got := c.e.Message(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}
