package broker

import (
	"io"
	"testing"
)

// BenchmarkWebRequest measures one proxied GET of a small page: resolve,
// policy, a fresh upstream connection, relay.
func BenchmarkWebRequest(b *testing.B) {
	up := newUpstream(b, false, hello)
	p := startProxy(b, webConfig(newTestResolver("site.test", "127.0.0.1")), Grants{Web: true})
	url := "http://site.test:" + up.port() + "/"
	for b.Loop() {
		resp, err := p.client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
