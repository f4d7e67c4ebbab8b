// Package httpcall sends one JSON request to a model provider's HTTP API and
// returns the response body. Rate limits, server errors and lost connections
// are retried with exponential backoff and jitter; a server's Retry-After is
// honoured; no wait runs past the context's deadline, and the caller's
// RetryHook may refuse any retry (the budget may not pay for it).
//
// Response bodies come from outside and are capped: a body larger than the
// limit is refused with model.ErrResponseTooLarge instead of being buffered.
package httpcall

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ephemeralhq/ephemeral/hostd/model"
)

// Defaults used where a Client field is zero.
const (
	DefaultMaxResponseBytes = 8 << 20
	DefaultMaxAttempts      = 5
	DefaultBaseDelay        = 500 * time.Millisecond
	DefaultMaxDelay         = 20 * time.Second
)

// maxErrorBodyBytes bounds what is read of a failed response: only its
// message is wanted.
const maxErrorBodyBytes = 64 << 10

// maxRetryAfterSeconds clamps absurd Retry-After values (one day): far
// beyond any run's deadline, so the deadline check refuses the wait.
const maxRetryAfterSeconds = 24 * 60 * 60

// maxErrorMessageRunes bounds the provider text copied into an error.
const maxErrorMessageRunes = 300

// Client posts JSON to one provider. The zero value is usable; it is safe
// for concurrent use.
type Client struct {
	// Provider names the API in errors ("openai").
	Provider string
	// HTTP sends the requests; nil means http.DefaultClient. Time limits
	// come from the context, so it needs no Timeout of its own.
	HTTP             *http.Client
	MaxResponseBytes int64
	// MaxAttempts counts the first attempt too.
	MaxAttempts int
	// BaseDelay is the backoff before the first retry; it doubles per
	// retry up to MaxDelay, and each wait is jittered down by up to half.
	BaseDelay time.Duration
	MaxDelay  time.Duration
}

// PostJSON posts body to url with header and returns the body of the first
// 2xx answer. A non-2xx answer that is not retried comes back as a
// *model.APIError.
func (c *Client) PostJSON(ctx context.Context, url string, header http.Header, body []byte, hook model.RetryHook) ([]byte, error) {
	attempts := cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	for attempt := 1; ; attempt++ {
		respBody, retryAfter, err := c.attempt(ctx, url, header, body)
		if err == nil {
			return respBody, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			// Make the deadline visible to errors.Is even when the
			// failure surfaced as something else (a cut-off body).
			if !errors.Is(err, ctxErr) {
				err = fmt.Errorf("%w: %w", err, ctxErr)
			}
			return nil, err
		}
		if !retryable(err) || attempt >= attempts {
			return nil, err
		}
		wait := retryAfter
		if wait == 0 {
			wait = c.backoff(attempt)
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return nil, fmt.Errorf("%s: waiting %v to retry would pass the deadline: %w (last failure: %w)",
				c.Provider, wait, context.DeadlineExceeded, err)
		}
		if hook != nil {
			if herr := hook(ctx, model.Retry{Attempt: attempt + 1, Wait: wait, Err: err}); herr != nil {
				return nil, fmt.Errorf("%s: retry refused: %w (last failure: %w)", c.Provider, herr, err)
			}
		}
		if serr := sleep(ctx, wait); serr != nil {
			return nil, fmt.Errorf("%s: waiting to retry: %w (last failure: %w)", c.Provider, serr, err)
		}
	}
}

// attempt makes one request. It returns the server's Retry-After with a
// failed answer so the caller can honour it.
func (c *Client) attempt(ctx context.Context, url string, header http.Header, body []byte) ([]byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, 0, fmt.Errorf("%s: build request: %w", c.Provider, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")

	httpClient := c.HTTP
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, 0, &connError{fmt.Errorf("%s: POST %s: %w", c.Provider, req.URL.Path, err)}
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		apiErr := &model.APIError{
			Provider:   c.Provider,
			StatusCode: resp.StatusCode,
			RetryAfter: ParseRetryAfter(resp.Header, time.Now()),
		}
		errBody, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBodyBytes))
		apiErr.Type, apiErr.Message = ParseErrorBody(errBody)
		return nil, apiErr.RetryAfter, apiErr
	}

	limit := cmp.Or(c.MaxResponseBytes, DefaultMaxResponseBytes)
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, 0, &connError{fmt.Errorf("%s: read response: %w", c.Provider, err)}
	}
	if int64(len(respBody)) > limit {
		return nil, 0, fmt.Errorf("%s: body over %d bytes: %w", c.Provider, limit, model.ErrResponseTooLarge)
	}
	return respBody, 0, nil
}

// connError marks a failure to get an answer at all (refused, reset,
// truncated): worth retrying. A lost answer may still have been billed by
// the provider; the RetryHook is where the budget can decline to risk it.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

func retryable(err error) bool {
	var apiErr *model.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Temporary()
	}
	var ce *connError
	return errors.As(err, &ce)
}

// backoff is the wait before retry number attempt (1-based): exponential,
// capped, with "equal jitter" so concurrent runs do not retry in lockstep
// yet never retry immediately.
func (c *Client) backoff(attempt int) time.Duration {
	base := cmp.Or(c.BaseDelay, DefaultBaseDelay)
	maxDelay := cmp.Or(c.MaxDelay, DefaultMaxDelay)
	d := base
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	half := d / 2
	return half + rand.N(half+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ParseRetryAfter reads how long the server asks to wait: OpenAI's
// retry-after-ms, else Retry-After as delta-seconds or an HTTP date. Zero
// when absent, unparsable or in the past.
func ParseRetryAfter(h http.Header, now time.Time) time.Duration {
	if ms := strings.TrimSpace(h.Get("Retry-After-Ms")); ms != "" {
		if v, err := strconv.ParseFloat(ms, 64); err == nil && v > 0 {
			return time.Duration(min(v, maxRetryAfterSeconds*1000) * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		// Clamp before multiplying so a huge value cannot overflow.
		return time.Duration(min(max(secs, 0), maxRetryAfterSeconds)) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return min(max(at.Sub(now), 0), maxRetryAfterSeconds*time.Second)
	}
	return 0
}

// ParseErrorBody extracts the error type and message from a provider's
// error body. Both OpenAI and Anthropic use {"error": {"type", "message"}};
// some compatible servers send {"error": "text"}. Anything else yields a
// cleaned prefix of the body as the message.
func ParseErrorBody(body []byte) (errType, message string) {
	var envelope struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &envelope) == nil && len(envelope.Error) > 0 {
		var obj struct {
			Type    string `json:"type"`
			Code    any    `json:"code"`
			Message string `json:"message"`
		}
		var text string
		switch {
		case json.Unmarshal(envelope.Error, &obj) == nil && (obj.Message != "" || obj.Type != ""):
			return clean(obj.Type), clean(obj.Message)
		case json.Unmarshal(envelope.Error, &text) == nil:
			return "", clean(text)
		}
	}
	return "", clean(string(body))
}

// clean makes provider text safe to put in logs and errors: valid UTF-8,
// no control characters, bounded length.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if utf8.RuneCountInString(s) > maxErrorMessageRunes {
		s = string([]rune(s)[:maxErrorMessageRunes]) + "…"
	}
	return s
}
