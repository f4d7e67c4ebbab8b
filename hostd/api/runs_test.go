package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
	"github.com/ephemeralhq/ephemeral/hostd/timeline"
)

func TestProductPageRun(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	queued := h.createRun(productPageRequest, "Idempotency-Key", "6f1c0a5e-page")
	if queued.Status != store.Queued && queued.Status != store.Running {
		t.Fatalf("new run status %s", queued.Status)
	}
	if !runIDPattern.MatchString(queued.ID) || queued.Cost.Reserved != 40000 {
		t.Fatalf("new run: id %q reserved %d", queued.ID, queued.Cost.Reserved)
	}
	run := h.waitFinished(queued.ID)
	if run.Status != store.Succeeded {
		t.Fatalf("status %s, error %+v", run.Status, run.Error)
	}
	want := costJSON{Reserved: 40000, Charged: 3530, Released: 36470, Model: 330, Web: 0, Compute: 3200}
	if run.Cost != want {
		t.Fatalf("cost %+v, want %+v", run.Cost, want)
	}
	if run.Output == nil || !strings.Contains(*run.Output, "2 3 5 7") {
		t.Fatalf("output %v", run.Output)
	}
	if run.Usage.Tokens != 5214 || run.Usage.ModelCalls != 3 {
		t.Fatalf("usage %+v", run.Usage)
	}
	var events struct{ Data []eventJSON }
	h.do("GET", "/v1/runs/"+run.ID+"/events", "").decode(t, &events)
	var got []string
	for _, e := range events.Data {
		got = append(got, e.Category+" | "+e.Message)
	}
	wantEvents := []string{
		"Queued | Budget $0.04 reserved",
		"MicroVM | microVM ready",
		"MicroVM | worker started · shell on · web off",
		"Shell | $ pwd; whoami",
		"MicroVM | microVM destroyed",
		"Successful | 3 model calls, 5,214 tokens",
		"Worker destroyed | $0.00353 charged, $0.03647 released",
	}
	if strings.Join(got, "\n") != strings.Join(wantEvents, "\n") {
		t.Fatalf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantEvents, "\n"))
	}
	for i := 1; i < len(events.Data); i++ {
		if events.Data[i].T < events.Data[i-1].T {
			t.Fatalf("t goes backwards: %v", events.Data)
		}
	}
	if a := h.balance(); a.Charged != 3530 || a.Held != 0 || a.Available != 10_000_000-3530 {
		t.Fatalf("balance %+v", a)
	}
}

func TestRejectsBadInput(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	big := strings.Repeat("x", MaxBodyBytes)
	tests := []struct {
		name   string
		body   string
		header []string
		status int
		code   string
		param  string
	}{
		{"empty body", "", []string{"Content-Type", "application/json"}, 400, "invalid_json", ""},
		{"not json", "{prompt", nil, 400, "invalid_json", ""},
		{"array", `[1]`, nil, 400, "parameter_invalid_type", ""},
		{"trailing data", `{"prompt":"p","max_cost_micros":1} {}`, nil, 400, "invalid_json", ""},
		{"unknown field", `{"prompt":"p","max_cost_micros":1,"network":true}`, nil, 400, "unknown_parameter", "network"},
		{"misspelt permission", `{"prompt":"p","max_cost_micros":1,"shel":true}`, nil, 400, "unknown_parameter", "shel"},
		{"prompt missing", `{"max_cost_micros":1}`, nil, 400, "parameter_missing", "prompt"},
		{"prompt blank", `{"prompt":"  ","max_cost_micros":1}`, nil, 400, "parameter_invalid", "prompt"},
		{"prompt wrong type", `{"prompt":5,"max_cost_micros":1}`, nil, 400, "parameter_invalid_type", "prompt"},
		{"prompt too long", `{"prompt":"` + strings.Repeat("a", MaxPromptChars+1) + `","max_cost_micros":1}`, nil, 400, "parameter_invalid", "prompt"},
		{"shell wrong type", `{"prompt":"p","max_cost_micros":1,"shell":"yes"}`, nil, 400, "parameter_invalid_type", "shell"},
		{"web wrong type", `{"prompt":"p","max_cost_micros":1,"web":1}`, nil, 400, "parameter_invalid_type", "web"},
		{"zdr wrong type", `{"prompt":"p","max_cost_micros":1,"zero_data_retention":"true"}`, nil, 400, "parameter_invalid_type", "zero_data_retention"},
		{"model empty", `{"prompt":"p","max_cost_micros":1,"model":""}`, nil, 400, "parameter_invalid", "model"},
		{"timeout zero", `{"prompt":"p","max_cost_micros":1,"timeout_seconds":0}`, nil, 400, "parameter_out_of_range", "timeout_seconds"},
		{"timeout too long", `{"prompt":"p","max_cost_micros":1,"timeout_seconds":3601}`, nil, 400, "parameter_out_of_range", "timeout_seconds"},
		{"timeout fraction", `{"prompt":"p","max_cost_micros":1,"timeout_seconds":1.5}`, nil, 400, "parameter_invalid_type", "timeout_seconds"},
		{"timeout string", `{"prompt":"p","max_cost_micros":1,"timeout_seconds":"120"}`, nil, 400, "parameter_invalid_type", "timeout_seconds"},
		{"budget missing", `{"prompt":"p"}`, nil, 400, "parameter_missing", "max_cost_micros"},
		{"budget zero", `{"prompt":"p","max_cost_micros":0}`, nil, 400, "parameter_out_of_range", "max_cost_micros"},
		{"budget negative", `{"prompt":"p","max_cost_micros":-5}`, nil, 400, "parameter_out_of_range", "max_cost_micros"},
		{"budget over cap", `{"prompt":"p","max_cost_micros":5000001}`, nil, 400, "parameter_out_of_range", "max_cost_micros"},
		{"budget overflows int64", `{"prompt":"p","max_cost_micros":99999999999999999999}`, nil, 400, "parameter_invalid_type", "max_cost_micros"},
		{"connections not list", `{"prompt":"p","max_cost_micros":1,"connections":{}}`, nil, 400, "parameter_invalid_type", "connections"},
		{"connection without name", `{"prompt":"p","max_cost_micros":1,"connections":[{"methods":["GET"]}]}`, nil, 400, "parameter_invalid", "connections[0].name"},
		{"connection bad name", `{"prompt":"p","max_cost_micros":1,"connections":[{"name":"../x","methods":["GET"]}]}`, nil, 400, "parameter_invalid", "connections[0].name"},
		{"connection twice", `{"prompt":"p","max_cost_micros":1,"connections":[{"name":"gh","methods":["GET"]},{"name":"gh","methods":["GET"]}]}`, nil, 400, "parameter_invalid", "connections[1].name"},
		{"connection no methods", `{"prompt":"p","max_cost_micros":1,"connections":[{"name":"gh","methods":[]}]}`, nil, 400, "parameter_missing", "connections[0].methods"},
		{"connection bad method", `{"prompt":"p","max_cost_micros":1,"connections":[{"name":"gh","methods":["GET","TRACE"]}]}`, nil, 400, "parameter_invalid", "connections[0].methods[1]"},
		{"connection unknown field", `{"prompt":"p","max_cost_micros":1,"connections":[{"name":"gh","methods":["GET"],"token":"x"}]}`, nil, 400, "unknown_parameter", "connections[0].token"},
		{"field in other case", `{"prompt":"p","max_cost_micros":1,"Web":true}`, nil, 400, "unknown_parameter", "Web"},
		{"field in upper case", `{"PROMPT":"p","max_cost_micros":1}`, nil, 400, "unknown_parameter", "PROMPT"},
		{"connection field in other case", `{"prompt":"p","max_cost_micros":1,"connections":[{"Name":"gh","methods":["GET"]}]}`, nil, 400, "unknown_parameter", "connections[0].Name"},
		{"field twice", `{"prompt":"p","max_cost_micros":1,"web":false,"web":true}`, nil, 400, "duplicate_parameter", "web"},
		{"budget twice", `{"prompt":"p","max_cost_micros":1,"max_cost_micros":5000000}`, nil, 400, "duplicate_parameter", "max_cost_micros"},
		{"connection field twice", `{"prompt":"p","max_cost_micros":1,"connections":[{"name":"gh","methods":["GET"],"methods":["DELETE"]}]}`, nil, 400, "duplicate_parameter", "connections[0].methods"},
		{"file field twice", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","path":"b"}]}`, nil, 400, "duplicate_parameter", "files[0].path"},
		{"nested too deep", `{"prompt":"p","max_cost_micros":1,"files":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, nil, 400, "invalid_json", ""},
		{"file absolute", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"/etc/passwd","content":"x"}]}`, nil, 400, "parameter_invalid", "files[0].path"},
		{"file dotdot", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"../x","content":"x"}]}`, nil, 400, "parameter_invalid", "files[0].path"},
		{"file inner dotdot", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a/../../x","content":"x"}]}`, nil, 400, "parameter_invalid", "files[0].path"},
		{"file unclean", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a//b","content":"x"}]}`, nil, 400, "parameter_invalid", "files[0].path"},
		{"file empty path", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"","content":"x"}]}`, nil, 400, "parameter_invalid", "files[0].path"},
		{"file NUL", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a\u0000b","content":"x"}]}`, nil, 400, "parameter_invalid", "files[0].path"},
		{"file no content", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a.txt"}]}`, nil, 400, "parameter_missing", "files[0].content"},
		{"file too big", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a.txt","content":"` + strings.Repeat("a", MaxFileBytes+1) + `"}]}`, nil, 400, "parameter_invalid", "files[0].content"},
		{"file twice", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":""},{"path":"a","content":""}]}`, nil, 400, "parameter_conflict", "files[1].path"},
		{"file trailing slash", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a/","content":""}]}`, nil, 400, "parameter_invalid", "files[0].path"},
		{"file dot slash", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":""},{"path":"./a","content":""}]}`, nil, 400, "parameter_invalid", "files[1].path"},
		{"outputs not list", `{"prompt":"p","max_cost_micros":1,"outputs":"report.md"}`, nil, 400, "parameter_invalid_type", "outputs"},
		{"output absolute", `{"prompt":"p","max_cost_micros":1,"outputs":["report.md","/etc/shadow"]}`, nil, 400, "parameter_invalid", "outputs[1]"},
		{"output dotdot", `{"prompt":"p","max_cost_micros":1,"outputs":["../x"]}`, nil, 400, "parameter_invalid", "outputs[0]"},
		{"output double star", `{"prompt":"p","max_cost_micros":1,"outputs":["out/**/*.csv"]}`, nil, 400, "parameter_invalid", "outputs[0]"},
		{"output bad glob", `{"prompt":"p","max_cost_micros":1,"outputs":["out/[a-"]}`, nil, 400, "parameter_invalid", "outputs[0]"},
		{"output twice", `{"prompt":"p","max_cost_micros":1,"outputs":["a","b","a"]}`, nil, 400, "parameter_conflict", "outputs[2]"},
		{"too many outputs", `{"prompt":"p","max_cost_micros":1,"outputs":["a"` + strings.Repeat(`,"a"`, 16) + `]}`, nil, 400, "parameter_invalid", "outputs"},
		{"file bad encoding", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","encoding":"hex"}]}`, nil, 400, "parameter_invalid", "files[0].encoding"},
		{"file bad base64", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"not base64!","encoding":"base64"}]}`, nil, 400, "parameter_invalid", "files[0].content"},
		{"file base64 too big", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","encoding":"base64","content":"` + base64.StdEncoding.EncodeToString(make([]byte, MaxFileBytes+1)) + `"}]}`, nil, 400, "parameter_invalid", "files[0].content"},
		{"file setuid", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","mode":"4755"}]}`, nil, 400, "parameter_invalid", "files[0].mode"},
		{"file sticky", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","mode":"1777"}]}`, nil, 400, "parameter_invalid", "files[0].mode"},
		{"file unreadable", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","mode":"0200"}]}`, nil, 400, "parameter_invalid", "files[0].mode"},
		{"file mode words", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","mode":"rwxr-xr-x"}]}`, nil, 400, "parameter_invalid", "files[0].mode"},
		{"file mode number", `{"prompt":"p","max_cost_micros":1,"files":[{"path":"a","content":"x","mode":755}]}`, nil, 400, "parameter_invalid_type", "files.mode"},
		{"webhook not http", `{"prompt":"p","max_cost_micros":1,"webhook_url":"ftp://hooks.acme.example/"}`, nil, 400, "parameter_invalid", "webhook_url"},
		{"webhook loopback", `{"prompt":"p","max_cost_micros":1,"webhook_url":"http://127.0.0.1:8080/"}`, nil, 400, "parameter_invalid", "webhook_url"},
		{"webhook metadata", `{"prompt":"p","max_cost_micros":1,"webhook_url":"http://169.254.169.254/"}`, nil, 400, "parameter_invalid", "webhook_url"},
		{"webhook localhost", `{"prompt":"p","max_cost_micros":1,"webhook_url":"https://localhost/hook"}`, nil, 400, "parameter_invalid", "webhook_url"},
		{"webhook user info", `{"prompt":"p","max_cost_micros":1,"webhook_url":"https://u:p@hooks.acme.example/"}`, nil, 400, "parameter_invalid", "webhook_url"},
		{"webhook without secret", `{"prompt":"p","max_cost_micros":1,"webhook_url":"https://hooks.acme.example/"}`, nil, 400, "webhook_secret_missing", "webhook_url"},
		{"body too large", `{"prompt":"` + big + `","max_cost_micros":1}`, nil, 413, "body_too_large", ""},
		{"bad idempotency key", productPageRequest, []string{"Idempotency-Key", "has space"}, 400, "parameter_invalid", "Idempotency-Key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := h.do("POST", "/v1/runs", tt.body, tt.header...)
			if resp.status != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.status, tt.status, resp.body)
			}
			e := resp.apiError(t)
			if e.Code != tt.code || e.Param != tt.param || e.Type != invalidRequest || e.Message == "" {
				t.Fatalf("error %+v, want code %q param %q", e, tt.code, tt.param)
			}
		})
	}
	if a := h.balance(); a.Held != 0 || a.Charged != 0 {
		t.Fatalf("rejected requests touched the balance: %+v", a)
	}
	var list struct{ Data []runJSON }
	h.do("GET", "/v1/runs", "").decode(t, &list)
	if len(list.Data) != 0 {
		t.Fatalf("rejected requests created %d runs", len(list.Data))
	}
}

// Two files that cannot both be written are refused before anything is
// reserved, naming both.
func TestRejectsConflictingFiles(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	file := func(p string) string { return `{"path":"` + p + `","content":"x"}` }
	for _, tt := range []struct {
		files []string
		param string
		names []string
	}{
		{[]string{"a", "a/b"}, "files[1].path", []string{"files[0].path", "files[1].path"}},
		{[]string{"a/b", "a"}, "files[0].path", []string{"files[0].path", "files[1].path"}},
		{[]string{"x.txt", "d", "d/e/f/g.txt"}, "files[2].path", []string{"files[1].path", "files[2].path"}},
		{[]string{"a", "b", "a"}, "files[2].path", []string{"files[0].path", "files[2].path"}},
	} {
		body := `{"prompt":"p","max_cost_micros":1,"files":[`
		for i, p := range tt.files {
			if i > 0 {
				body += ","
			}
			body += file(p)
		}
		resp := h.do("POST", "/v1/runs", body+"]}")
		if resp.status != http.StatusBadRequest {
			t.Fatalf("%v: %d %s", tt.files, resp.status, resp.body)
		}
		e := resp.apiError(t)
		if e.Code != "parameter_conflict" || e.Param != tt.param || !strings.Contains(e.Message, tt.names[0]) || !strings.Contains(e.Message, tt.names[1]) {
			t.Errorf("%v: %+v, want param %s naming %v", tt.files, e, tt.param, tt.names)
		}
	}
	// Siblings and names that share a prefix do not conflict.
	h.createRun(`{"prompt":"p","max_cost_micros":1,"files":[` + file("a/b") + "," + file("a/c") + "," + file("ab") + "," + file("a.d/x") + `]}`)
	if a := h.balance(); a.Held+a.Charged != 1 {
		t.Fatalf("balance %+v: only the last run should have reserved", a)
	}
}

func TestAcceptsFullPermissions(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	h.addConnection(h.orgID, "github", "GET", "POST", "DELETE")
	run := h.createRun(`{"prompt":"p","model":"anthropic/claude","shell":true,"web":true,"timeout_seconds":3600,
		"max_cost_micros":5000000,"zero_data_retention":false,
		"connections":[{"name":"github","methods":["GET","POST"]}],
		"files":[{"path":"data/input.csv","content":"a,b\n1,2\n"},{"path":".env.example","content":""}]}`)
	var req canonicalRequest
	if err := jsonUnmarshal(run.Request, &req); err != nil {
		t.Fatal(err)
	}
	if !req.Shell || !req.Web || len(req.Connections) != 1 || req.Connections[0].Methods[1] != "POST" ||
		len(req.Files) != 2 || req.Files[0].Path != "data/input.csv" || req.Model != "anthropic/claude" {
		t.Fatalf("stored request %+v", req)
	}
}

func TestPermissionsDefaultOff(t *testing.T) {
	var got runs.Spec
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		got = spec
		return runs.Result{}, nil
	})})
	run := h.createRun(`{"prompt":"p","max_cost_micros":100}`)
	h.waitFinished(run.ID)
	if got.Shell || got.Web || len(got.Connections) != 0 || len(got.Files) != 0 || got.ZeroDataRetention ||
		got.Timeout.Seconds() != DefaultTimeout || got.Model != "openai/gpt-6-luna" {
		t.Fatalf("defaults: %+v", got)
	}
}

func TestAuthentication(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	run := h.waitFinished(h.createRun(productPageRequest).ID)
	for name, auth := range map[string]string{
		"missing":     "",
		"not bearer":  "Basic " + h.key,
		"wrong key":   "Bearer eph_0123456789abcdef_wrongsecret",
		"not a key":   "Bearer sk-123",
		"tampered":    "Bearer " + tamper(h.key),
		"prefix only": "Bearer eph_",
	} {
		resp := h.do("GET", "/v1/runs/"+run.ID, "", "Authorization", auth)
		if resp.status != http.StatusUnauthorized || resp.apiError(t).Type != authentication {
			t.Errorf("%s: %d %s", name, resp.status, resp.body)
		}
	}
	// Another organisation's key sees a 404, the same as for a run that
	// does not exist.
	_, otherKey := h.newOrg("other", 1_000_000)
	for _, path := range []string{"/v1/runs/" + run.ID, "/v1/runs/" + run.ID + "/events", "/v1/runs/" + run.ID + "/recording"} {
		resp := h.do("GET", path, "", "Authorization", "Bearer "+otherKey)
		if resp.status != http.StatusNotFound || resp.apiError(t).Code != "run_not_found" {
			t.Errorf("other org GET %s: %d %s", path, resp.status, resp.body)
		}
	}
	for _, method := range []string{"DELETE"} {
		if resp := h.do(method, "/v1/runs/"+run.ID, "", "Authorization", "Bearer "+otherKey); resp.status != http.StatusNotFound {
			t.Errorf("other org %s: %d", method, resp.status)
		}
	}
	if resp := h.do("POST", "/v1/runs/"+run.ID+"/cancel", "", "Authorization", "Bearer "+otherKey); resp.status != http.StatusNotFound {
		t.Errorf("other org cancel: %d", resp.status)
	}
	var list struct{ Data []runJSON }
	h.do("GET", "/v1/runs", "", "Authorization", "Bearer "+otherKey).decode(t, &list)
	if len(list.Data) != 0 {
		t.Errorf("other org lists %d runs", len(list.Data))
	}
	// A revoked key stops working.
	id, _ := parseKeyID(t, h.key)
	if err := h.store.RevokeKey(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if resp := h.do("GET", "/v1/balance", ""); resp.status != http.StatusUnauthorized {
		t.Errorf("revoked key: %d", resp.status)
	}
}

func TestIdempotency(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	first := h.createRun(productPageRequest, "Idempotency-Key", "key-1")
	// Same body, even re-formatted, returns the same run without a second hold.
	again := h.do("POST", "/v1/runs", strings.Join(strings.Fields(productPageRequest), " "), "Idempotency-Key", "key-1")
	var replay runJSON
	again.decode(t, &replay)
	if again.status != http.StatusOK || replay.ID != first.ID || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s", again.status, again.body)
	}
	diff := h.do("POST", "/v1/runs", strings.Replace(productPageRequest, `"web": false`, `"web": true`, 1), "Idempotency-Key", "key-1")
	if diff.status != http.StatusUnprocessableEntity || diff.apiError(t).Code != "idempotency_key_reused" {
		t.Fatalf("different body: %d %s", diff.status, diff.body)
	}
	h.waitFinished(first.ID)
	// Another organisation may use the same key for its own run.
	_, otherKey := h.newOrg("other", 1_000_000)
	other := h.do("POST", "/v1/runs", productPageRequest, "Idempotency-Key", "key-1", "Authorization", "Bearer "+otherKey)
	if other.status != http.StatusCreated {
		t.Fatalf("other org same key: %d %s", other.status, other.body)
	}
	if a := h.balance(); a.Charged != 3530 || a.Held != 0 {
		t.Fatalf("one run charged once expected: %+v", a)
	}
}

func TestIdempotencyRace(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, harnessConfig{executor: blockUntil(release)})
	const n = 20
	ids := make([]string, n)
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp := h.do("POST", "/v1/runs", productPageRequest, "Idempotency-Key", "same-key")
			var run runJSON
			if resp.status < 300 {
				resp.decode(t, &run)
			}
			ids[i], statuses[i] = run.ID, resp.status
		})
	}
	wg.Wait()
	created := 0
	for i := range n {
		if statuses[i] == http.StatusCreated {
			created++
		}
		if ids[i] == "" || ids[i] != ids[0] {
			t.Fatalf("request %d: status %d id %q, want %q", i, statuses[i], ids[i], ids[0])
		}
	}
	if created != 1 {
		t.Fatalf("%d requests created a run, want 1", created)
	}
	if a := h.balance(); a.Held != 40000 {
		t.Fatalf("held %d, want one reservation of 40000", a.Held)
	}
	close(release)
	h.waitFinished(ids[0])
}

// blockUntil is an Executor that waits for release (or its context).
func blockUntil(release <-chan struct{}) scriptedExecutor {
	return func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		select {
		case <-release:
			return runs.Result{Output: "done"}, nil
		case <-ctx.Done():
			return runs.Result{}, ctx.Err()
		}
	}
}

func TestBudgetRace(t *testing.T) {
	release := make(chan struct{})
	// The balance covers exactly 10 runs of $0.04.
	h := newHarness(t, harnessConfig{executor: blockUntil(release), credit: 10 * 40000})
	const n = 50
	statuses := make([]int, n)
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp := h.do("POST", "/v1/runs", productPageRequest, "Idempotency-Key", fmt.Sprint("budget-", i))
			statuses[i] = resp.status
			if resp.status == http.StatusCreated {
				var run runJSON
				resp.decode(t, &run)
				ids[i] = run.ID
			} else if e := resp.apiError(t); resp.status != http.StatusPaymentRequired || e.Code != "insufficient_balance" {
				t.Errorf("request %d: %d %+v", i, resp.status, e)
			}
		})
	}
	wg.Wait()
	created := 0
	for _, st := range statuses {
		if st == http.StatusCreated {
			created++
		}
	}
	if created != 10 {
		t.Fatalf("%d runs reserved, want exactly 10", created)
	}
	if a := h.balance(); a.Available != 0 || a.Held != 400000 {
		t.Fatalf("balance %+v", a)
	}
	close(release)
	for _, id := range ids {
		if id != "" {
			h.waitFinished(id)
		}
	}
	if a := h.balance(); a.Held != 0 || a.Available != 400000 {
		t.Fatalf("after settling (nothing metered): %+v", a)
	}
}

func TestPerOrgConcurrencyCap(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, harnessConfig{executor: blockUntil(release), maxActivePerOrg: 2})
	a := h.createRun(productPageRequest)
	b := h.createRun(productPageRequest)
	resp := h.do("POST", "/v1/runs", productPageRequest)
	if resp.status != http.StatusTooManyRequests || resp.apiError(t).Code != "concurrency_limit" || resp.header.Get("Retry-After") == "" {
		t.Fatalf("third run: %d %s", resp.status, resp.body)
	}
	// Another organisation is not affected.
	_, otherKey := h.newOrg("other", 1_000_000)
	if resp := h.do("POST", "/v1/runs", productPageRequest, "Authorization", "Bearer "+otherKey); resp.status != http.StatusCreated {
		t.Fatalf("other org: %d %s", resp.status, resp.body)
	}
	close(release)
	h.waitFinished(a.ID)
	h.waitFinished(b.ID)
	h.createRun(productPageRequest)
}

func TestInsufficientBalance(t *testing.T) {
	h := newHarness(t, harnessConfig{credit: 39999})
	resp := h.do("POST", "/v1/runs", productPageRequest)
	if e := resp.apiError(t); resp.status != http.StatusPaymentRequired || e.Type != insufficient || e.Param != "max_cost_micros" {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
}

func TestHardTimeout(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		if err := rec.Event(timeline.MicroVM, timeline.MicroVMReady, nil); err != nil {
			return runs.Result{}, err
		}
		ctx, stop := rec.StartClock(ctx)
		defer stop()
		<-ctx.Done() // a command that never finishes
		return runs.Result{}, rec.Charge(ledger.Usage{VMTime: spec.Timeout})
	})})
	run := h.waitFinished(h.createRun(`{"prompt":"sleep","shell":true,"timeout_seconds":1,"max_cost_micros":40000}`).ID)
	if run.Status != store.TimedOut || run.Error == nil || run.Error.Code != "timeout" {
		t.Fatalf("status %s error %+v", run.Status, run.Error)
	}
	if run.Cost.Compute != 240 || run.Cost.Charged != 240 || run.Cost.Released != 40000-240 {
		t.Fatalf("cost %+v", run.Cost)
	}
	var events struct{ Data []eventJSON }
	h.do("GET", "/v1/runs/"+run.ID+"/events", "").decode(t, &events)
	last := events.Data[len(events.Data)-2]
	if last.Category != timeline.TimedOut || last.Message != "timeout of 1 s reached, microVM destroyed" {
		t.Fatalf("timeline does not say it timed out: %+v", events.Data)
	}
}

func TestBudgetExceededStopsRun(t *testing.T) {
	var charges int
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		for ctx.Err() == nil {
			charges++
			// A model call that costs more than was left still happened:
			// it is recorded, but the charge is capped at the limit.
			if err := rec.Charge(ledger.Usage{ModelCalls: 1, InputTokens: 1000, ModelMicros: 15000}); err != nil {
				if !errors.Is(err, ledger.ErrBudgetExceeded) {
					return runs.Result{}, err
				}
				<-ctx.Done() // the Recorder stopped the run
				return runs.Result{}, err
			}
		}
		return runs.Result{}, ctx.Err()
	})})
	run := h.waitFinished(h.createRun(productPageRequest).ID)
	if run.Status != store.BudgetExceeded || run.Error.Code != "budget_exceeded" {
		t.Fatalf("status %s error %+v", run.Status, run.Error)
	}
	if charges != 3 || run.Usage.ModelCalls != 3 {
		t.Fatalf("%d charges, %d model calls recorded; want the third to hit the limit", charges, run.Usage.ModelCalls)
	}
	if run.Cost.Charged != 40000 || run.Cost.Model != 40000 || run.Cost.Released != 0 {
		t.Fatalf("cost %+v: must be charged exactly its limit", run.Cost)
	}
	if a := h.balance(); a.Charged != 40000 {
		t.Fatalf("balance %+v", a)
	}
}

func TestCancel(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: blockUntil(nil)})
	run := h.createRun(productPageRequest)
	resp := h.do("POST", "/v1/runs/"+run.ID+"/cancel", "")
	var canceled runJSON
	resp.decode(t, &canceled)
	if resp.status != http.StatusOK || canceled.Status != store.Canceled || canceled.Cost.Released != 40000 {
		t.Fatalf("cancel: %d %s", resp.status, resp.body)
	}
	again := h.do("POST", "/v1/runs/"+run.ID+"/cancel", "")
	if again.status != http.StatusOK {
		t.Fatalf("cancel twice: %d", again.status)
	}
	if a := h.balance(); a.Held != 0 || a.Charged != 0 {
		t.Fatalf("balance %+v", a)
	}
	events := h.sse(run.ID, "")
	if !strings.Contains(events[len(events)-3].data, "canceled by request") {
		t.Fatalf("timeline: %+v", events)
	}
}

func TestCancelQueuedRun(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: blockUntil(nil), maxConcurrent: 1})
	running := h.createRun(productPageRequest)
	queued := h.createRun(productPageRequest) // waits for the only slot
	var canceled runJSON
	h.do("POST", "/v1/runs/"+queued.ID+"/cancel", "").decode(t, &canceled)
	if canceled.Status != store.Canceled || canceled.StartedAt != nil || canceled.Cost.Released != 40000 {
		t.Fatalf("queued run after cancel: %s started %v cost %+v", canceled.Status, canceled.StartedAt, canceled.Cost)
	}
	h.do("POST", "/v1/runs/"+running.ID+"/cancel", "")
	if a := h.balance(); a.Held != 0 || a.Charged != 0 {
		t.Fatalf("holds left: %+v", a)
	}
}

func TestDeletePurgesContent(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		rec.ContentEvent(timeline.Shell, timeline.Command("cat secret.txt"), map[string]any{"output": "hunter2"})
		<-release
		return runs.Result{Output: "the secret is hunter2"}, nil
	})})
	run := h.createRun(`{"prompt":"find hunter2","max_cost_micros":1000}`)
	if resp := h.do("DELETE", "/v1/runs/"+run.ID, ""); resp.status != http.StatusConflict || resp.apiError(t).Code != "run_active" {
		t.Fatalf("delete active run: %d %s", resp.status, resp.body)
	}
	close(release)
	h.waitFinished(run.ID)
	resp := h.do("DELETE", "/v1/runs/"+run.ID, "")
	var purged runJSON
	resp.decode(t, &purged)
	if resp.status != http.StatusOK || purged.PurgedAt == nil || purged.Output != nil || string(purged.Request) != "null" {
		t.Fatalf("delete: %d %s", resp.status, resp.body)
	}
	if purged.Cost.Reserved != 1000 || purged.Status != store.Succeeded {
		t.Fatalf("metering lost by purge: %+v", purged)
	}
	events := h.do("GET", "/v1/runs/"+run.ID+"/events", "")
	if strings.Contains(string(events.body), "hunter2") || strings.Contains(string(events.body), "cat secret") {
		t.Fatalf("events still hold content: %s", events.body)
	}
	if !strings.Contains(string(events.body), "Budget $0.001 reserved") {
		t.Fatalf("purge removed the system's own events: %s", events.body)
	}
}

func TestListRunsPaginatesNewestFirst(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	var created []string
	for range 5 {
		run := h.createRun(productPageRequest)
		created = append(created, run.ID)
	}
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		path := "/v1/runs?limit=2"
		if cursor != "" {
			path += "&starting_after=" + cursor
		}
		var page struct {
			Data       []runJSON
			HasMore    bool    `json:"has_more"`
			NextCursor *string `json:"next_cursor"`
		}
		h.do("GET", path, "").decode(t, &page)
		for _, r := range page.Data {
			got = append(got, r.ID)
		}
		if !page.HasMore {
			if page.NextCursor != nil || pages != 2 {
				t.Fatalf("last page: cursor %v after %d pages", page.NextCursor, pages)
			}
			break
		}
		cursor = *page.NextCursor
	}
	for i := range created {
		if got[i] != created[len(created)-1-i] {
			t.Fatalf("order %v, want reverse of %v", got, created)
		}
	}
	for _, bad := range []string{"?limit=0", "?limit=101", "?limit=x", "?starting_after=nope", "?starting_after=run_00000000000000000000000000000000"} {
		resp := h.do("GET", "/v1/runs"+bad, "")
		if e := resp.apiError(t); resp.status != http.StatusBadRequest || e.Param == "" {
			t.Errorf("%s: %d %+v", bad, resp.status, e)
		}
	}
	for _, id := range created {
		h.waitFinished(id)
	}
}

// ?status= lists only the runs in that status, newest first, a page at a
// time; the cursor may name a run in another status.
func TestListRunsFiltersByStatus(t *testing.T) {
	h := newHarness(t, harnessConfig{executor: scriptedExecutor(func(ctx context.Context, spec runs.Spec, rec *runs.Recorder) (runs.Result, error) {
		if strings.Contains(spec.Prompt, "fail") {
			return runs.Result{}, errors.New("the model broke")
		}
		return productPageRun(ctx, spec, rec)
	})})
	failing := strings.Replace(productPageRequest, "This is a sandbox test.", "This run will fail.", 1)
	var all, failed []string
	for i := range 5 {
		body := productPageRequest
		if i%2 == 1 {
			body = failing
		}
		run := h.createRun(body)
		if h.waitFinished(run.ID).Status == store.Failed {
			failed = append([]string{run.ID}, failed...)
		}
		all = append([]string{run.ID}, all...)
	}
	list := func(query string) (ids []string, statuses []store.Status, next *string) {
		var page struct {
			Data       []runJSON
			NextCursor *string `json:"next_cursor"`
		}
		h.do("GET", "/v1/runs?"+query, "").decode(t, &page)
		for _, r := range page.Data {
			ids, statuses = append(ids, r.ID), append(statuses, r.Status)
		}
		return ids, statuses, page.NextCursor
	}
	if ids, _, next := list("status=failed"); fmt.Sprint(ids) != fmt.Sprint(failed) || next != nil || len(failed) != 2 {
		t.Errorf("failed runs %v (next %v), want %v", ids, next, failed)
	}
	ids, statuses, next := list("status=succeeded&limit=2")
	if fmt.Sprint(ids) != fmt.Sprint([]string{all[0], all[2]}) || next == nil || *next != all[2] {
		t.Fatalf("first page of succeeded runs %v %v (next %v), want %v", ids, statuses, next, []string{all[0], all[2]})
	}
	if ids, _, next := list("status=succeeded&limit=2&starting_after=" + *next); fmt.Sprint(ids) != fmt.Sprint([]string{all[4]}) || next != nil {
		t.Errorf("second page of succeeded runs %v (next %v), want %v", ids, next, all[4])
	}
	// A cursor from the unfiltered list: the failed run all[1].
	if ids, _, _ := list("status=succeeded&starting_after=" + all[1]); fmt.Sprint(ids) != fmt.Sprint([]string{all[2], all[4]}) {
		t.Errorf("succeeded runs after %s: %v", all[1], ids)
	}
	if ids, _, _ := list("status=running"); len(ids) != 0 {
		t.Errorf("running runs: %v", ids)
	}
	resp := h.do("GET", "/v1/runs?status=done", "")
	if e := resp.apiError(t); resp.status != http.StatusBadRequest || e.Param != "status" || !strings.Contains(e.Message, "budget_exceeded") {
		t.Errorf("unknown status: %d %+v", resp.status, e)
	}
}

func TestBalanceEndpoint(t *testing.T) {
	h := newHarness(t, harnessConfig{credit: 1_000_000})
	h.waitFinished(h.createRun(productPageRequest).ID)
	var b struct {
		Object    string
		Available int64 `json:"available_micros"`
		Charged   int64 `json:"charged_micros"`
		Credited  int64 `json:"credited_micros"`
	}
	h.do("GET", "/v1/balance", "").decode(t, &b)
	if b.Object != "balance" || b.Available != 1_000_000-3530 || b.Charged != 3530 || b.Credited != 1_000_000 {
		t.Fatalf("balance %+v", b)
	}
}

func TestUnknownRunAndPath(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	for _, path := range []string{"/v1/runs/run_00000000000000000000000000000000", "/v1/runs/not-an-id", "/v1/nope"} {
		if resp := h.do("GET", path, ""); resp.status != http.StatusNotFound || resp.apiError(t).Code == "" {
			t.Errorf("GET %s: %d %s", path, resp.status, resp.body)
		}
	}
}

// tamper changes the key's last character to a different one.
func tamper(key string) string {
	last := "A"
	if strings.HasSuffix(key, last) {
		last = "B"
	}
	return key[:len(key)-1] + last
}
