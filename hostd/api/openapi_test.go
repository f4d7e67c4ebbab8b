package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/ephemeralhq/ephemeral/examples"
	"github.com/ephemeralhq/ephemeral/hostd/example"
	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/recording"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// TestHandlersMatchOpenAPIDocument sends requests covering every endpoint
// and the main error responses to the real handlers, and checks each
// request and each response against the served OpenAPI document.
func TestHandlersMatchOpenAPIDocument(t *testing.T) {
	h := newHarness(t, harnessConfig{credit: 1_000_000})
	served := h.do("GET", "/openapi.json", "")
	doc, err := openapi3.NewLoader().LoadFromData(served.body)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("document invalid: %v", err)
	}
	// A second daemon whose limits are used up by one request each.
	limited := newHarness(t, harnessConfig{limits: Limits{
		KeyRunCreations: Rate{PerSecond: 0.001, Burst: 1}, KeyReads: Rate{PerSecond: 0.001, Burst: 1},
		AddressReads: Rate{PerSecond: 0.001, Burst: 2}}})
	doc.Servers = openapi3.Servers{{URL: h.url}, {URL: limited.url}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}

	// An event stream is checked event by event against the Event schema.
	eventSchema := doc.Components.Schemas["Event"].Value
	openapi3filter.RegisterBodyDecoder("text/event-stream", func(body io.Reader, _ http.Header, _ *openapi3.SchemaRef,
		_ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(body)
		if err != nil {
			return nil, err
		}
		for _, e := range parseSSE(b) {
			if e.event != "timeline" {
				continue
			}
			var v any
			if err := json.Unmarshal([]byte(e.data), &v); err != nil {
				return nil, err
			}
			if err := eventSchema.VisitJSON(v); err != nil {
				return nil, fmt.Errorf("event %s: %w", e.id, err)
			}
		}
		return string(b), nil
	})
	defer openapi3filter.UnregisterBodyDecoder("text/event-stream")

	// The examples the repository ships hold what the endpoints describe:
	// the request, the run, its events and its recording, so a recording
	// saved from the API replays like a shipped one.
	set, err := example.Load(examples.Files)
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range set.All() {
		for _, part := range []struct {
			schema string
			doc    json.RawMessage
		}{{"RunRequest", ex.Request}, {"Run", ex.Run}, {"Recording", ex.Recording}, {"Events", ex.Events}} {
			var v any
			if err := json.Unmarshal(part.doc, &v); err != nil {
				t.Fatal(err)
			}
			schema := doc.Components.Schemas[part.schema]
			if part.schema == "Events" {
				schema = &openapi3.SchemaRef{Value: openapi3.NewArraySchema().WithItems(doc.Components.Schemas["Event"].Value)}
			}
			if err := schema.Value.VisitJSON(v); err != nil {
				t.Errorf("example %s: its %s does not match the document: %v", ex.Name, part.schema, err)
			}
		}
	}

	run := h.createRun(productPageRequest)
	h.waitFinished(run.ID)
	cookie, _ := h.register("ada@example.org")
	replay := strings.Replace(productPageRequest, `"web": false,`, `"web": false, "replay": "product-page",`, 1)
	h.do("POST", "/v1/webhook_secret/rotate", "")
	const withOutputs = `{"prompt":"p","max_cost_micros":40000,"outputs":["report.md","out/*.csv"],"webhook_url":"https://hooks.acme.example/e",` +
		`"files":[{"path":"run.sh","content":"IyEvYmluL3NoCg==","encoding":"base64","mode":"0755"}]}`
	outRun := h.waitFinished(h.createRun(withOutputs).ID)
	calls := []apiCall{
		{"GET", "/healthz", "", nil, 200, false},
		{"POST", "/v1/runs", productPageRequest, []string{"Idempotency-Key", "k1"}, 201, false},
		{"POST", "/v1/runs", productPageRequest, []string{"Idempotency-Key", "k1"}, 200, false},
		{"POST", "/v1/runs", strings.Replace(productPageRequest, "120", "60", 1), []string{"Idempotency-Key", "k1"}, 422, false},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":1,"shel":true}`, nil, 400, true},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":999999999}`, nil, 400, false}, // over the configured cap
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"../x","content":""}]}`, nil, 400, false},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":5000000}`, nil, 402, false},
		{"GET", "/v1/runs", "", nil, 200, false},
		{"GET", "/v1/runs?limit=1", "", nil, 200, false},
		{"GET", "/v1/runs?limit=0", "", nil, 400, true},
		{"GET", "/v1/runs?status=succeeded&limit=1", "", nil, 200, false},
		{"GET", "/v1/runs?status=done", "", nil, 400, true},
		{"GET", "/v1/runs/" + run.ID, "", nil, 200, false},
		{"GET", "/v1/runs/run_00000000000000000000000000000000", "", nil, 404, false},
		{"GET", "/v1/runs/" + run.ID, "", []string{"Authorization", "Bearer nope"}, 401, false},
		{"GET", "/v1/runs/" + run.ID + "/events", "", nil, 200, false},
		{"GET", "/v1/runs/" + run.ID + "/events?after=2", "", nil, 200, false},
		{"GET", "/v1/runs/" + run.ID + "/events", "", []string{"Accept", "text/event-stream", "Last-Event-ID", "3"}, 200, false},
		{"GET", "/v1/runs/" + run.ID + "/events", "", []string{"Accept", "text/event-stream", "Last-Event-ID", "1000"}, 204, false},
		{"POST", "/v1/runs", replay, nil, 201, false},
		{"POST", "/v1/runs", strings.Replace(replay, `"shell": true`, `"shell": false`, 1), nil, 400, false},
		{"GET", "/v1/runs?status=succeeded", "", nil, 200, false},
		{"GET", "/v1/models", "", []string{"Authorization", ""}, 200, false},
		{"GET", "/v1/balance", "", []string{"Authorization", "", "Cookie", cookie}, 200, false},
		{"POST", "/v1/runs", productPageRequest, []string{"Authorization", "", "Cookie", cookie, "Sec-Fetch-Site", "cross-site"}, 403, false},
		{"GET", "/v1/runs/" + run.ID + "/recording", "", nil, 200, false},
		{"GET", "/v1/runs/run_00000000000000000000000000000000/recording", "", nil, 404, false},
		{"POST", "/v1/runs/" + run.ID + "/cancel", "", nil, 200, false},
		{"DELETE", "/v1/runs/" + run.ID, "", nil, 200, false},
		{"GET", "/v1/runs/" + run.ID + "/recording", "", nil, 404, false},
		{"GET", "/v1/balance", "", nil, 200, false},
		{"POST", "/v1/webhook_secret/rotate", "", nil, 200, false},
		{"POST", "/v1/runs", withOutputs, nil, 201, false},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":1,"outputs":["/etc/shadow"]}`, nil, 400, false},
		{"GET", "/v1/runs/" + outRun.ID, "", nil, 200, false},
		{"GET", "/v1/runs/" + outRun.ID + "/outputs/report.md", "", nil, 200, false},
		{"GET", "/v1/runs/" + outRun.ID + "/outputs/nope.md", "", nil, 404, false},
		{"GET", "/v1/runs/" + outRun.ID + "/webhook_deliveries", "", nil, 200, false},
		{"GET", "/v1/runs/" + run.ID + "/webhook_deliveries", "", nil, 404, false},
	}
	if len(outRun.Outputs) != 1 {
		t.Fatalf("the run with outputs (%s, %+v) kept %+v", outRun.Status, outRun.Error, outRun.Outputs)
	}
	for _, c := range calls {
		checkAgainstDocument(t, router, h, c)
	}
	// 429s, for the key's share of run creations and of other requests,
	// and for the address's share before any key is looked up.
	for _, c := range []apiCall{
		{"POST", "/v1/runs", productPageRequest, nil, 201, false},
		{"POST", "/v1/runs", productPageRequest, nil, 429, false},
		{"GET", "/v1/balance", "", nil, 200, false},
		{"GET", "/v1/runs", "", nil, 429, false},
		{"GET", "/healthz", "", nil, 429, false},
		{"GET", "/openapi.json", "", nil, 429, false},
		{"GET", "/v1/runs/run_00000000000000000000000000000000", "", nil, 429, false},
	} {
		checkAgainstDocument(t, router, limited, c)
	}
}

// apiCall is a request to check against the document and its expected
// status.
type apiCall struct {
	method, path, body string
	headers            []string
	wantStatus         int
	// Some bad requests are ones the document itself forbids: only their
	// responses are checked.
	invalidRequest bool
}

// checkAgainstDocument sends c to h's handlers and checks the request and
// the response against the document router was built from.
func checkAgainstDocument(t *testing.T, router routers.Router, h *harness, c apiCall) {
	t.Helper()
	req, err := http.NewRequest(c.method, h.url+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.key)
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(c.headers); i += 2 {
		req.Header.Set(c.headers[i], c.headers[i+1])
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: not in the document: %v", c.method, c.path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if (reqErr != nil) != c.invalidRequest {
		t.Fatalf("%s %s: request validation: %v (want invalid: %v)", c.method, c.path, reqErr, c.invalidRequest)
	}
	// Validation may have read the body and filled in defaults.
	req.Body, req.ContentLength = io.NopCloser(strings.NewReader(c.body)), int64(len(c.body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != c.wantStatus {
		t.Fatalf("%s %s: status %d, want %d: %s", c.method, c.path, resp.StatusCode, c.wantStatus, body)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
		Header: resp.Header, Body: io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s %s: response %d does not match the document: %v\n%s", c.method, c.path, resp.StatusCode, err, body)
	}
}

// A recording cut at its cap is served marked truncated, as the document
// describes it, and replays up to the cut.
func TestTruncatedRecordingIsServedMarked(t *testing.T) {
	h := newHarness(t, harnessConfig{maxRecordingBytes: 2000, executor: scriptedExecutor(
		func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
			exchanges := pageRecording(spec)
			for turn := 2; turn <= 4; turn++ {
				prev := exchanges[len(exchanges)-1]
				req := prev.Request
				req.Messages = append(slices.Clip(req.Messages),
					model.Message{Role: model.RoleAssistant, ToolCalls: prev.Response.ToolCalls},
					model.Message{Role: model.RoleTool, ToolResults: []model.ToolResult{{CallID: "call_1", Content: strings.Repeat("out ", 200)}}})
				exchanges = append(exchanges, recording.Exchange{Turn: turn, Request: req, Response: prev.Response, StartedAt: prev.StartedAt})
			}
			return runs.Result{Output: "done"}, record(rec, exchanges)
		})})
	run := h.waitFinished(h.createRun(productPageRequest).ID)
	if run.Status != "succeeded" {
		t.Fatalf("run %s", run.Status)
	}
	resp := h.do("GET", "/v1/runs/"+run.ID+"/recording", "")
	if resp.status != http.StatusOK {
		t.Fatalf("recording: %d %s", resp.status, resp.body)
	}
	served := h.do("GET", "/openapi.json", "")
	doc, err := openapi3.NewLoader().LoadFromData(served.body)
	if err != nil {
		t.Fatal(err)
	}
	var body any
	if err := json.Unmarshal(resp.body, &body); err != nil {
		t.Fatal(err)
	}
	if err := doc.Components.Schemas["Recording"].Value.VisitJSON(body); err != nil {
		t.Fatalf("truncated recording does not match the document: %v\n%s", err, resp.body)
	}
	rec, err := recording.Decode(bytes.NewReader(resp.body))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Truncated == nil || rec.Truncated.KeptTurns != len(rec.Exchanges) || rec.Truncated.KeptTurns+rec.Truncated.DroppedTurns != 4 ||
		rec.Truncated.LimitBytes != 2000 || len(rec.Exchanges) == 0 {
		t.Fatalf("%d turns, truncation %+v", len(rec.Exchanges), rec.Truncated)
	}
	if _, err := recording.NewReplay(rec); err != nil {
		t.Errorf("the kept turns do not replay: %v", err)
	}
}
