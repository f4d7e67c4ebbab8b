package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
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

// TestRecordedSessionMatchesOpenAPIDocument records a session against the
// real handlers — every operation, answered with every status the
// document lists for it, and every path asked with a method it does not
// take — then replays each exchange through a validating check against the
// served document: the request (its query parameters too), the response's
// status, headers and body. It fails when an operation or a documented
// status never came up, so the document cannot promise what the API does
// not do, nor the API answer what the document does not say.
func TestRecordedSessionMatchesOpenAPIDocument(t *testing.T) {
	doc := loadDocument(t, newHarness(t, harnessConfig{}))
	checkShippedExamples(t, doc)
	session := recordSession(t)

	// Requests go to several daemons (one with its limits used up, one
	// whose database is gone): each is a server of the document.
	doc.Servers = nil
	for _, h := range session.daemons {
		doc.Servers = append(doc.Servers, &openapi3.Server{URL: h.url})
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	registerEventStreamDecoder(t, doc)

	covered := map[string]bool{} // "operationId status"
	wrongMethod := map[string]bool{}
	for _, ex := range session.exchanges {
		route, params, err := router.FindRoute(ex.req)
		if err != nil {
			// Not an operation: a path of the document with a method it
			// does not list, or no path of the document.
			if path := documentPath(doc, ex.req.URL.Path); path != "" {
				checkMethodNotAllowed(t, doc, path, ex)
				wrongMethod[path] = true
			} else {
				checkErrorBody(t, doc, ex, http.StatusNotFound)
			}
			continue
		}
		checkExchange(t, route, params, ex)
		covered[route.Operation.OperationID+" "+strconv.Itoa(ex.status)] = true
	}

	for path, item := range doc.Paths.Map() {
		if !wrongMethod[path] {
			t.Errorf("%s was never asked with a method it does not take", path)
		}
		for method, op := range item.Operations() {
			for status := range op.Responses.Map() {
				if !covered[op.OperationID+" "+status] {
					t.Errorf("%s %s (%s): status %s never came up", method, path, op.OperationID, status)
				}
			}
		}
	}
}

// loadDocument fetches the document h serves and checks that it is valid.
func loadDocument(t *testing.T, h *harness) *openapi3.T {
	t.Helper()
	served := h.do("GET", "/openapi.json", "")
	doc, err := openapi3.NewLoader().LoadFromData(served.body)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("document invalid: %v", err)
	}
	return doc
}

// checkShippedExamples checks that the examples the repository ships hold
// what the endpoints describe: the request, the run, its events and its
// recording, so a recording saved from the API replays like a shipped one.
func checkShippedExamples(t *testing.T, doc *openapi3.T) {
	t.Helper()
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
}

// registerEventStreamDecoder checks an event stream event by event against
// the Event schema.
func registerEventStreamDecoder(t *testing.T, doc *openapi3.T) {
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
	t.Cleanup(func() { openapi3filter.UnregisterBodyDecoder("text/event-stream") })
}

// apiCall is a request of the session and the status it must get.
type apiCall struct {
	method, path, body string
	headers            []string
	wantStatus         int
	// Some bad requests are ones the document itself forbids: the check
	// must find them invalid.
	invalidRequest bool
}

// exchange is one request of the recorded session and its response.
type exchange struct {
	call   apiCall
	req    *http.Request // as sent; its body is call.body
	status int
	header http.Header
	body   []byte
}

func (ex exchange) String() string { return ex.call.method + " " + ex.call.path }

// session is the exchanges recorded, and the daemons they went to.
type session struct {
	daemons   []*harness
	exchanges []exchange
}

// send sends c to h's handlers, with h's key unless c's headers say
// otherwise, and records the exchange.
func (s *session) send(t *testing.T, h *harness, c apiCall) {
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
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != c.wantStatus {
		t.Fatalf("%s %s: status %d, want %d: %s", c.method, c.path, resp.StatusCode, c.wantStatus, body)
	}
	req.Body = nil
	s.exchanges = append(s.exchanges, exchange{call: c, req: req, status: resp.StatusCode, header: resp.Header, body: body})
}

// heldPrompt is the prompt of a run that stays running until canceled.
const heldPrompt = "hold until canceled"

// recordSession runs a user's session against the real handlers: runs
// created, listed, followed, canceled and deleted, their recordings,
// outputs and webhooks, the balance and the models, and every way each of
// these can fail.
func recordSession(t *testing.T) *session {
	h := newHarness(t, harnessConfig{credit: 1_000_000, executor: scriptedExecutor(
		func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
			if spec.Prompt == heldPrompt {
				<-ctx.Done()
				return runs.Result{}, ctx.Err()
			}
			return productPageRun(ctx, spec, rec)
		})})
	// A daemon whose limits are used up by one request of each kind.
	limited := newHarness(t, harnessConfig{limits: Limits{
		KeyRunCreations: Rate{PerSecond: 0.001, Burst: 1}, KeyReads: Rate{PerSecond: 0.001, Burst: 1},
		AddressRunCreations: Rate{PerSecond: 0.001, Burst: 1}, AddressReads: Rate{PerSecond: 0.001, Burst: 1}}})
	// A daemon whose database is gone.
	broken := newHarness(t, harnessConfig{})
	s := &session{daemons: []*harness{h, limited, broken}}

	run := h.createRun(productPageRequest)
	h.waitFinished(run.ID)
	held := h.createRun(strings.Replace(productPageRequest, "This is a sandbox test. Do these steps with the shell and report the real output, never what you expect.", heldPrompt, 1))
	cookie, _ := h.register("ada@example.org")
	asBrowser := func(extra ...string) []string {
		return append([]string{"Authorization", "", "Cookie", cookie}, extra...)
	}
	crossSite := asBrowser("Sec-Fetch-Site", "cross-site")
	badKey := []string{"Authorization", "Bearer eph_not_a_key"}
	replay := strings.Replace(productPageRequest, `"web": false,`, `"web": false, "replay": "product-page",`, 1)
	h.do("POST", "/v1/webhook_secret/rotate", "")
	const withOutputs = `{"prompt":"p","max_cost_micros":40000,"outputs":["report.md","out/*.csv"],"webhook_url":"https://hooks.acme.example/e",` +
		`"files":[{"path":"run.sh","content":"IyEvYmluL3NoCg==","encoding":"base64","mode":"0755"}]}`
	outRun := h.waitFinished(h.createRun(withOutputs).ID)
	if len(outRun.Outputs) != 1 {
		t.Fatalf("the run with outputs (%s, %+v) kept %+v", outRun.Status, outRun.Error, outRun.Outputs)
	}
	var page struct {
		NextCursor string `json:"next_cursor"`
	}
	h.do("GET", "/v1/runs?limit=1", "").decode(t, &page)
	const unknown = "/v1/runs/run_00000000000000000000000000000000"
	runPath, outPath := "/v1/runs/"+run.ID, "/v1/runs/"+outRun.ID

	for _, c := range []apiCall{
		{"GET", "/healthz", "", nil, 200, false},
		{"GET", "/healthz?deep=1", "", nil, 400, true},
		{"GET", "/openapi.json", "", nil, 200, false},
		{"GET", "/openapi.json?format=yaml", "", nil, 400, true},

		{"POST", "/v1/runs", productPageRequest, []string{"Idempotency-Key", "k1"}, 201, false},
		{"POST", "/v1/runs", productPageRequest, []string{"Idempotency-Key", "k1"}, 200, false},
		{"POST", "/v1/runs", strings.Replace(productPageRequest, "120", "60", 1), []string{"Idempotency-Key", "k1"}, 422, false},
		{"POST", "/v1/runs", replay, nil, 201, false},
		{"POST", "/v1/runs", strings.Replace(replay, `"shell": true`, `"shell": false`, 1), nil, 400, false},
		{"POST", "/v1/runs", withOutputs, nil, 201, false},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":1,"shel":true}`, nil, 400, true},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":999999999}`, nil, 400, false}, // over the configured cap
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"../x","content":""}]}`, nil, 400, false},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":1,"outputs":["/etc/shadow"]}`, nil, 400, false},
		{"POST", "/v1/runs?dry_run=1", productPageRequest, nil, 400, true},
		{"POST", "/v1/runs", `{"prompt":"p","max_cost_micros":5000000}`, nil, 402, false},
		{"POST", "/v1/runs", productPageRequest, crossSite, 403, false},
		{"POST", "/v1/runs", `{"prompt":"` + strings.Repeat("x", MaxBodyBytes) + `","max_cost_micros":1}`, nil, 413, true},
		{"POST", "/v1/runs", productPageRequest, []string{"Content-Type", "text/plain"}, 415, true},
		{"POST", "/v1/runs", productPageRequest, badKey, 401, false},

		{"GET", "/v1/runs", "", nil, 200, false},
		{"GET", "/v1/runs?limit=1", "", nil, 200, false},
		{"GET", "/v1/runs?limit=1&starting_after=" + page.NextCursor, "", nil, 200, false},
		{"GET", "/v1/runs?status=succeeded&limit=1", "", nil, 200, false},
		{"GET", "/v1/runs?limit=0", "", nil, 400, true},
		{"GET", "/v1/runs?status=done", "", nil, 400, true},
		{"GET", "/v1/runs?Status=succeeded", "", nil, 400, true},
		{"GET", "/v1/runs", "", badKey, 401, false},

		{"GET", runPath, "", nil, 200, false},
		{"GET", runPath + "?expand=events", "", nil, 400, true},
		{"GET", unknown, "", nil, 404, false},
		{"GET", runPath, "", badKey, 401, false},

		{"GET", runPath + "/events", "", nil, 200, false},
		{"GET", runPath + "/events?after=2", "", nil, 200, false},
		{"GET", runPath + "/events", "", []string{"Accept", "text/event-stream", "Last-Event-ID", "3"}, 200, false},
		{"GET", runPath + "/events", "", []string{"Accept", "text/event-stream", "Last-Event-ID", "1000"}, 204, false},
		{"GET", runPath + "/events?after=-1", "", nil, 400, true},
		{"GET", unknown + "/events", "", nil, 404, false},
		{"GET", runPath + "/events", "", badKey, 401, false},

		{"GET", runPath + "/recording", "", nil, 200, false},
		{"GET", runPath + "/recording?v=1", "", nil, 400, true},
		{"GET", unknown + "/recording", "", nil, 404, false},
		{"GET", runPath + "/recording", "", badKey, 401, false},

		{"GET", outPath, "", nil, 200, false},
		{"GET", outPath + "/outputs/report.md", "", nil, 200, false},
		{"GET", outPath + "/outputs/report.md?download=1", "", nil, 400, true},
		{"GET", outPath + "/outputs/nope.md", "", nil, 404, false},
		{"GET", outPath + "/outputs/report.md", "", badKey, 401, false},
		{"GET", outPath + "/webhook_deliveries", "", nil, 200, false},
		{"GET", outPath + "/webhook_deliveries?limit=1", "", nil, 400, true},
		{"GET", runPath + "/webhook_deliveries", "", nil, 404, false},
		{"GET", outPath + "/webhook_deliveries", "", badKey, 401, false},

		{"DELETE", "/v1/runs/" + held.ID, "", nil, 409, false},
		{"POST", "/v1/runs/" + held.ID + "/cancel", "", crossSite, 403, false},
		{"POST", "/v1/runs/" + held.ID + "/cancel?reason=x", "", nil, 400, true},
		{"POST", "/v1/runs/" + held.ID + "/cancel", "", nil, 200, false},
		{"POST", unknown + "/cancel", "", nil, 404, false},
		{"POST", runPath + "/cancel", "", badKey, 401, false},
		{"DELETE", runPath, "", crossSite, 403, false},
		{"DELETE", runPath + "?force=1", "", nil, 400, true},
		{"DELETE", runPath, "", badKey, 401, false},
		{"DELETE", runPath, "", nil, 200, false},
		{"DELETE", unknown, "", nil, 404, false},
		{"GET", runPath + "/recording", "", nil, 404, false}, // purged

		{"GET", "/v1/balance", "", nil, 200, false},
		{"GET", "/v1/balance", "", asBrowser(), 200, false},
		{"GET", "/v1/balance?currency=eur", "", nil, 400, true},
		{"GET", "/v1/balance", "", badKey, 401, false},
		{"GET", "/v1/balance", "", asBrowser("Cookie", "ephemeral_session=ended"), 401, false},
		{"GET", "/v1/models", "", []string{"Authorization", ""}, 200, false},
		{"GET", "/v1/models?provider=openai", "", nil, 400, true},
		{"POST", "/v1/webhook_secret/rotate", "", nil, 200, false},
		{"POST", "/v1/webhook_secret/rotate?force=1", "", nil, 400, true},
		{"POST", "/v1/webhook_secret/rotate", "", crossSite, 403, false},
		{"POST", "/v1/webhook_secret/rotate", "", badKey, 401, false},

		// A method a path does not take, on every path; a path the API
		// does not serve.
		{"DELETE", "/healthz", "", nil, 405, false},
		{"POST", "/openapi.json", "", nil, 405, false},
		{"PUT", "/v1/runs", "", nil, 405, false},
		{"POST", runPath, "", nil, 405, false},
		{"GET", runPath + "/cancel", "", nil, 405, false},
		{"POST", runPath + "/events", "", nil, 405, false},
		{"POST", runPath + "/recording", "", nil, 405, false},
		{"DELETE", outPath + "/outputs/report.md", "", nil, 405, false},
		{"POST", outPath + "/webhook_deliveries", "", nil, 405, false},
		{"GET", "/v1/webhook_secret/rotate", "", nil, 405, false},
		{"PATCH", "/v1/balance", "", nil, 405, false},
		{"POST", "/v1/models", "", nil, 405, false},
		{"GET", "/v1/nothing", "", nil, 404, false},
	} {
		s.send(t, h, c)
	}

	// Past the limits: one request of each kind uses them up, then every
	// operation is 429, before its key is looked up.
	s.send(t, limited, apiCall{"POST", "/v1/runs", productPageRequest, nil, 201, false})
	s.send(t, limited, apiCall{"GET", "/v1/balance", "", nil, 200, false})
	for _, c := range everyOperation(run.ID, outRun.ID, 429) {
		s.send(t, limited, c)
	}

	// With its database gone, the daemon says it is unhealthy, and every
	// operation that needs the database fails as the daemon's fault.
	broken.store.Close()
	for _, c := range everyOperation(run.ID, outRun.ID, 500) {
		if c.path == "/healthz" {
			c.wantStatus = 503
		}
		if c.path == "/openapi.json" || c.path == "/v1/models" {
			c.wantStatus = 200
		}
		s.send(t, broken, c)
	}
	return s
}

// everyOperation is one call of each operation expecting status.
func everyOperation(runID, outRunID string, status int) []apiCall {
	runPath := "/v1/runs/" + runID
	return []apiCall{
		{"GET", "/healthz", "", nil, status, false},
		{"GET", "/openapi.json", "", nil, status, false},
		{"POST", "/v1/runs", productPageRequest, nil, status, false},
		{"GET", "/v1/runs", "", nil, status, false},
		{"GET", runPath, "", nil, status, false},
		{"DELETE", runPath, "", nil, status, false},
		{"POST", runPath + "/cancel", "", nil, status, false},
		{"GET", runPath + "/events", "", nil, status, false},
		{"GET", runPath + "/recording", "", nil, status, false},
		{"GET", "/v1/runs/" + outRunID + "/outputs/report.md", "", nil, status, false},
		{"GET", "/v1/runs/" + outRunID + "/webhook_deliveries", "", nil, status, false},
		{"POST", "/v1/webhook_secret/rotate", "", nil, status, false},
		{"GET", "/v1/balance", "", nil, status, false},
		{"GET", "/v1/models", "", []string{"Authorization", ""}, status, false},
	}
}

// headersDocumented are response headers a client acts on: where one is
// sent, the document must say so for that operation and status.
var headersDocumented = []string{"Location", "Retry-After", "WWW-Authenticate", "Allow", "Idempotent-Replayed"}

// checkExchange checks ex's request against route's operation (also that
// it sends no query parameter the operation does not list) and its
// response against the status, headers and body the operation documents.
func checkExchange(t *testing.T, route *routers.Route, params map[string]string, ex exchange) {
	t.Helper()
	req := ex.req.Clone(context.Background())
	req.Body, req.ContentLength = io.NopCloser(strings.NewReader(ex.call.body)), int64(len(ex.call.body))
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if reqErr == nil {
		reqErr = undocumentedQuery(route, req)
	}
	if (reqErr != nil) != ex.call.invalidRequest {
		t.Errorf("%s: request validation: %v (want invalid: %v)", ex, reqErr, ex.call.invalidRequest)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: ex.status,
		Header: ex.header, Body: io.NopCloser(bytes.NewReader(ex.body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s: response %d does not match the document: %v\n%s", ex, ex.status, err, ex.body)
	}
	documented := route.Operation.Responses.Status(ex.status).Value.Headers
	for _, name := range headersDocumented {
		if ex.header.Get(name) != "" && documented[name] == nil {
			t.Errorf("%s: response %d sends %s, which the document does not list", ex, ex.status, name)
		}
	}
}

// undocumentedQuery names a query parameter of req that route's
// operation does not list.
func undocumentedQuery(route *routers.Route, req *http.Request) error {
	listed := map[string]bool{}
	for _, p := range slices.Concat(route.PathItem.Parameters, route.Operation.Parameters) {
		if p.Value.In == openapi3.ParameterInQuery {
			listed[p.Value.Name] = true
		}
	}
	for name := range req.URL.Query() {
		if !listed[name] {
			return fmt.Errorf("query parameter %q is not in the document", name)
		}
	}
	return nil
}

// documentPath is the document's path template that urlPath is an instance
// of ("" for none): a {parameter} stands for one path element, but the
// last, {path}, for the rest of the path (an output's path has slashes).
func documentPath(doc *openapi3.T, urlPath string) string {
	for _, template := range doc.Paths.InMatchingOrder() {
		var pattern strings.Builder
		for _, elem := range strings.Split(template, "/")[1:] {
			pattern.WriteString("/")
			switch {
			case elem == "{path}":
				pattern.WriteString(".+")
			case strings.HasPrefix(elem, "{"):
				pattern.WriteString("[^/]+")
			default:
				pattern.WriteString(regexp.QuoteMeta(elem))
			}
		}
		if regexp.MustCompile("^" + pattern.String() + "$").MatchString(urlPath) {
			return template
		}
	}
	return ""
}

// checkMethodNotAllowed checks a request with a method its path does not
// take: 405, the Error body, and Allow naming exactly the methods the
// document lists for the path (HEAD too where it lists GET), as the
// MethodNotAllowed response describes.
func checkMethodNotAllowed(t *testing.T, doc *openapi3.T, path string, ex exchange) {
	t.Helper()
	checkErrorBody(t, doc, ex, http.StatusMethodNotAllowed)
	ops := doc.Paths.Value(path).Operations()
	var want []string
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
		if ops[m] != nil || (m == "HEAD" && ops["GET"] != nil) {
			want = append(want, m)
		}
	}
	if got := ex.header.Get("Allow"); got != strings.Join(want, ", ") {
		t.Errorf("%s: Allow %q, want %q", ex, got, strings.Join(want, ", "))
	}
	if doc.Components.Responses["MethodNotAllowed"].Value.Headers["Allow"] == nil {
		t.Error("the document does not describe the 405 response's Allow header")
	}
}

// checkErrorBody checks a response no operation describes: its status and
// its Error body.
func checkErrorBody(t *testing.T, doc *openapi3.T, ex exchange, status int) {
	t.Helper()
	var v any
	if err := json.Unmarshal(ex.body, &v); err != nil || ex.status != status {
		t.Fatalf("%s: %d %s", ex, ex.status, ex.body)
	}
	if err := doc.Components.Schemas["Error"].Value.VisitJSON(v); err != nil {
		t.Errorf("%s: %v", ex, err)
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
