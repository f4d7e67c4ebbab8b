package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func (f *recordingFixture) queueWithWebhook(id, url string) {
	f.t.Helper()
	_, _, err := f.st.CreateRun(context.Background(), NewRun{ID: id, OrgID: f.orgID, RequestHash: []byte(id), Model: "m",
		TimeoutSeconds: 60, Reserve: 1000, CreatedAt: time.Now(), MaxActive: 10, Queued: Event{Category: "Queued", Message: "queued"},
		WebhookURL: url})
	if err != nil {
		f.t.Fatal(err)
	}
}

// A delivery waits for its run, becomes due in the transaction that
// finishes the run, records every attempt and ends with its outcome on
// the timeline, forgetting the URL.
func TestWebhookDeliveryLifecycle(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	const id, url = "run_hook1", "https://hooks.acme.test/ephemeral"
	f.queueWithWebhook(id, url)
	f.queue("run_nohook", false)
	now := time.Now()
	if due, err := f.st.ClaimDueWebhooks(ctx, now.Add(time.Hour), now.Add(2*time.Hour), 10); err != nil || len(due) != 0 {
		t.Fatalf("due before the run ended: %+v, %v", due, err)
	}
	f.finish(id, now.Add(time.Hour))
	f.finish("run_nohook", now.Add(time.Hour))
	due, err := f.st.ClaimDueWebhooks(ctx, time.Now(), time.Now().Add(time.Minute), 10)
	if err != nil || len(due) != 1 || due[0].RunID != id || due[0].URL != url || due[0].State != WebhookPending || due[0].OrgID != f.orgID {
		t.Fatalf("due after the run ended: %+v, %v", due, err)
	}
	// Claimed: a second deliverer (another node's) does not get it, until
	// the claim ends.
	if again, err := f.st.ClaimDueWebhooks(ctx, time.Now(), time.Now().Add(time.Minute), 10); err != nil || len(again) != 0 {
		t.Fatalf("claimed twice: %+v, %v", again, err)
	}
	if later, err := f.st.ClaimDueWebhooks(ctx, time.Now().Add(2*time.Minute), time.Now().Add(3*time.Minute), 10); err != nil || len(later) != 1 {
		t.Fatalf("not due again after its claim ended: %+v, %v", later, err)
	}

	retry := time.Now().Add(30 * time.Second).Truncate(time.Millisecond)
	first := WebhookAttempt{Attempt: 1, StartedAt: time.Now(), Duration: 120 * time.Millisecond, StatusCode: 503}
	if err := f.st.RecordWebhookAttempt(ctx, id, first, WebhookOutcome{RetryAt: &retry}); err != nil {
		t.Fatal(err)
	}
	if due, _ := f.st.ClaimDueWebhooks(ctx, time.Now(), time.Now().Add(time.Minute), 10); len(due) != 0 {
		t.Errorf("due before its retry: %+v", due)
	}
	if next, ok, err := f.st.NextWebhookAt(ctx); err != nil || !ok || !next.Equal(retry) {
		t.Errorf("next webhook at %v, %v, %v; want %v", next, ok, err, retry)
	}
	second := WebhookAttempt{Attempt: 2, StartedAt: time.Now(), Duration: time.Second, Error: "connection refused"}
	final := Event{Category: "Webhook", Message: "webhook delivered"}
	if err := f.st.RecordWebhookAttempt(ctx, id, second, WebhookOutcome{State: WebhookDelivered, Event: &final}); err != nil {
		t.Fatal(err)
	}
	d, attempts, err := f.st.Webhook(ctx, id)
	if err != nil || d.State != WebhookDelivered || d.URL != "" || d.Attempts != 2 || d.NextAttemptAt != nil || len(attempts) != 2 ||
		attempts[0].StatusCode != 503 || attempts[0].Duration != 120*time.Millisecond || attempts[1].Error != "connection refused" {
		t.Fatalf("delivery %+v, attempts %+v, %v", d, attempts, err)
	}
	if _, ok, _ := f.st.NextWebhookAt(ctx); ok {
		t.Error("an ended delivery is still due")
	}
	events, _ := f.st.Events(ctx, id, 0, 100)
	if last := events[len(events)-1]; last.Message != "webhook delivered" {
		t.Errorf("last timeline entry %q", last.Message)
	}
	if err := f.st.RecordWebhookAttempt(ctx, id, WebhookAttempt{Attempt: 3}, WebhookOutcome{State: WebhookFailed}); !errors.Is(err, ErrNotFound) {
		t.Errorf("attempt recorded for an ended delivery: %v", err)
	}
	if _, _, err := f.st.Webhook(ctx, "run_nohook"); !errors.Is(err, ErrNotFound) {
		t.Errorf("webhook of a run without one: %v", err)
	}

	if _, err := f.st.PurgeRun(ctx, f.orgID, id, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.Webhook(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Errorf("webhook after purge: %v", err)
	}
	if f.diskHolds(url) {
		t.Error("the webhook URL is still in the database files")
	}
}

func TestWebhookSecretIsReplacedWhenRotated(t *testing.T) {
	ctx := context.Background()
	f := newRecordingFixture(t)
	if _, _, err := f.st.WebhookSecret(ctx, f.orgID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("secret before one was set: %v", err)
	}
	for _, s := range []string{"first", "second"} {
		if err := f.st.SetWebhookSecret(ctx, f.orgID, []byte(s), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if sealed, at, err := f.st.WebhookSecret(ctx, f.orgID); err != nil || string(sealed) != "second" || at.IsZero() {
		t.Errorf("secret %q at %v, %v", sealed, at, err)
	}
}
