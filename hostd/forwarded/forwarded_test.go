package forwarded

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestOnlyTrustedProxiesAreBelieved(t *testing.T) {
	proxies, err := ParseProxies("10.0.0.0/8, 192.0.2.7, 2001:db8::/32")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, peer string
		xff, proto []string
		wantAddr   string
		wantSecure bool
	}{
		{"direct client, headers ignored", "198.51.100.9:4000", []string{"1.2.3.4"}, []string{"https"}, "198.51.100.9:4000", false},
		{"through the balancer", "10.1.2.3:5555", []string{"203.0.113.5"}, []string{"https"}, "203.0.113.5:0", true},
		{"client's own header is not believed", "10.1.2.3:5555", []string{"6.6.6.6, 203.0.113.5"}, []string{"http"}, "203.0.113.5:0", false},
		{"two proxies", "192.0.2.7:1", []string{"203.0.113.5, 10.9.9.9"}, []string{"https"}, "203.0.113.5:0", true},
		{"garbage hop: only the proxy is known", "10.1.2.3:5555", []string{"203.0.113.5, not-an-ip"}, nil, "10.1.2.3:5555", false},
		{"IPv6 proxy", "[2001:db8::1]:443", []string{"2001:dc8::9, 2001:db8::2"}, nil, "[2001:dc8::9]:0", false},
		{"no header", "10.1.2.3:5555", nil, nil, "10.1.2.3:5555", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gotAddr string
			var gotSecure bool
			h := proxies.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gotAddr, gotSecure = r.RemoteAddr, Secure(r)
			}))
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			for _, v := range tc.proto {
				r.Header.Add("X-Forwarded-Proto", v)
			}
			h.ServeHTTP(httptest.NewRecorder(), r)
			if gotAddr != tc.wantAddr || gotSecure != tc.wantSecure {
				t.Errorf("RemoteAddr %q secure %v, want %q %v", gotAddr, gotSecure, tc.wantAddr, tc.wantSecure)
			}
		})
	}
}

func TestParseProxiesRefusesGarbage(t *testing.T) {
	if _, err := ParseProxies("10.0.0.0/8, example.com"); err == nil {
		t.Fatal("a host name was accepted")
	}
	if p, err := ParseProxies(""); err != nil || len(p) != 0 {
		t.Fatalf("empty: %v %v", p, err)
	}
}
