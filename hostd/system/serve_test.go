package system

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// /metrics sums up every organisation: the daemon serves it on the metrics
// address only, never beside the public API.
func TestMetricsAreServedOnlyOnTheirOwnAddress(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := config.Defaults()
	cfg.StateDir = filepath.Join(t.TempDir(), "state")
	sys, err := New(ctx, cfg, Options{Executor: executorFunc(func(context.Context, runs.Spec, *runs.Recorder) (runs.Result, error) {
		return runs.Result{}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	if err := sys.Start(ctx); err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	apiLn, metricsLn := listen(), listen()
	apiURL, metricsURL := "http://"+apiLn.Addr().String(), "http://"+metricsLn.Addr().String()
	served := make(chan error, 1)
	go func() { served <- sys.serve(ctx, apiLn, metricsLn) }()

	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(metricsURL + "/metrics"); status != http.StatusOK || !strings.Contains(body, "ephemeral_money_charged_micros_total ") {
		t.Errorf("metrics address: %d %s", status, body)
	}
	if status, body := get(apiURL + "/metrics"); status != http.StatusNotFound || strings.Contains(body, "ephemeral_") {
		t.Errorf("API address serves metrics: %d %s", status, body)
	}
	if status, _ := get(apiURL + "/healthz"); status != http.StatusOK {
		t.Errorf("API healthz: %d", status)
	}
	if status, _ := get(metricsURL + "/v1/balance"); status != http.StatusNotFound {
		t.Errorf("metrics address serves the API: %d", status)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	for _, url := range []string{apiURL, metricsURL} {
		if _, err := http.Get(url + "/healthz"); err == nil {
			t.Errorf("%s still serves after shutdown", url)
		}
	}
}
