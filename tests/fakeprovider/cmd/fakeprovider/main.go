// Command fakeprovider serves a scripted fake model API (OpenAI Chat
// Completions and Anthropic Messages) for manual testing:
//
//	fakeprovider -listen 127.0.0.1:8399 -script turns.json [-api-key k]
//
// turns.json is a JSON array of fakeprovider.Turn. Point the daemon at it
// with EPHEMERAL_OPENAI_BASE_URL=http://127.0.0.1:8399/v1 or
// EPHEMERAL_ANTHROPIC_BASE_URL=http://127.0.0.1:8399. Each request is
// logged to stderr; the command exits on SIGINT or SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8399", "address to listen on")
	scriptPath := flag.String("script", "", "JSON file holding an array of turns (required)")
	apiKey := flag.String("api-key", "", "key clients must present (none when empty)")
	flag.Parse()
	if err := run(*listen, *scriptPath, *apiKey); err != nil {
		fmt.Fprintf(os.Stderr, "fakeprovider: %v\n", err)
		os.Exit(1)
	}
}

func run(listen, scriptPath, apiKey string) error {
	if scriptPath == "" {
		return errors.New("-script is required")
	}
	raw, err := os.ReadFile(scriptPath)
	if err != nil {
		return fmt.Errorf("read script: %w", err)
	}
	var turns []fakeprovider.Turn
	if err := json.Unmarshal(raw, &turns); err != nil {
		return fmt.Errorf("parse script %s: %w", scriptPath, err)
	}
	fake := fakeprovider.New(turns...)
	fake.APIKey = apiKey
	fake.OnRequest = func(r fakeprovider.Request) {
		limit := "no token limit"
		if r.MaxTokensField != "" {
			limit = fmt.Sprintf("%s=%d", r.MaxTokensField, r.MaxTokens)
		}
		log.Printf("%s model=%q %s tool_results=%d -> %d (%d turns left)",
			r.API, r.Model, limit, len(r.ToolResults), r.Status, fake.Remaining())
	}

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: fake, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("serving %d turns on http://%s (OpenAI base URL http://%[2]s/v1)", len(turns), ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	<-serveErr // Serve returns ErrServerClosed once Shutdown began.
	return nil
}
