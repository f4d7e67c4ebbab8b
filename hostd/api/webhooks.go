package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// WebhookSecrets are the organisations' webhook signing secrets (a
// *webhook.Secrets).
type WebhookSecrets interface {
	// Rotate makes a new secret, replacing the old, and returns it: the
	// only time it is shown.
	Rotate(ctx context.Context, orgID string) (secret string, createdAt time.Time, err error)
	Exists(ctx context.Context, orgID string) (bool, error)
}

// checkWebhookSecret refuses a run naming a webhook_url while its
// organisation has no secret to sign deliveries with: the receiver could
// not tell them from forgeries.
func (s *Server) checkWebhookSecret(ctx context.Context, orgID, webhookURL string) (*apiError, error) {
	if webhookURL == "" {
		return nil, nil
	}
	if s.webhooks == nil {
		return badParam("webhook_url", "webhooks_unavailable", "this daemon does not deliver webhooks"), nil
	}
	ok, err := s.webhooks.Exists(ctx, orgID)
	if err != nil || ok {
		return nil, err
	}
	return badParam("webhook_url", "webhook_secret_missing",
		"the organisation has no webhook secret to sign deliveries with: create one with POST /v1/webhook_secret/rotate"), nil
}

// rotateWebhookSecret makes the organisation a new webhook secret and
// shows it, once. Deliveries from then on are signed with it.
func (s *Server) rotateWebhookSecret(w http.ResponseWriter, r *http.Request, orgID string) {
	if s.webhooks == nil {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "not_found", Message: "this daemon does not deliver webhooks"})
		return
	}
	secret, at, err := s.webhooks.Rotate(r.Context(), orgID)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, struct {
		Object    string    `json:"object"`
		Secret    string    `json:"secret"`
		CreatedAt time.Time `json:"created_at"`
	}{"webhook_secret", secret, at})
}

// webhookAttemptJSON is one attempt of a run's webhook delivery.
type webhookAttemptJSON struct {
	Object     string    `json:"object"`
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	StatusCode *int      `json:"status_code"`
	Error      *string   `json:"error"`
}

// getWebhookDeliveries shows where a run's webhook delivery stands and
// every attempt made.
func (s *Server) getWebhookDeliveries(w http.ResponseWriter, r *http.Request, orgID string) {
	run, ok := s.loadRun(w, r, orgID)
	if !ok {
		return
	}
	d, attempts, err := s.store.Webhook(r.Context(), run.ID)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "webhook_not_found", Param: "id",
			Message: "the run named no webhook_url, or its content was purged"})
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	page := struct {
		Object        string               `json:"object"`
		State         store.WebhookState   `json:"state"`
		NextAttemptAt *time.Time           `json:"next_attempt_at"`
		Data          []webhookAttemptJSON `json:"data"`
	}{Object: "list", State: d.State, NextAttemptAt: d.NextAttemptAt, Data: []webhookAttemptJSON{}}
	for _, a := range attempts {
		aj := webhookAttemptJSON{Object: "webhook_attempt", Attempt: a.Attempt, StartedAt: a.StartedAt, DurationMS: a.Duration.Milliseconds()}
		if a.StatusCode != 0 {
			aj.StatusCode = &a.StatusCode
		}
		if a.Error != "" {
			aj.Error = &a.Error
		}
		page.Data = append(page.Data, aj)
	}
	writeJSON(w, http.StatusOK, page)
}
