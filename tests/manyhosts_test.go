package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/internal/pgtest"
	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// Three daemons on one machine, each with its own state directory and
// capacity for one run, share one throwaway PostgreSQL database, as the
// nodes of a cluster on several hosts would. One set-up serves every
// check, because every run boots a real microVM (under TCG here):
//
//  1. runs created on one node are executed by several;
//  2. a run's live event stream works from a node that does not execute
//     it, and resumes with Last-Event-ID on a third;
//  3. a node killed with SIGKILL has its run ended as node_lost by another
//     node within the lease, charged what was metered, executed once; the
//     restarted node leaves nothing of it behind;
//  4. 50 concurrent creations over the three nodes against a balance that
//     covers 10 create exactly 10, the money adding up throughout; an
//     Idempotency-Key sent to two nodes at once creates one run, and a
//     cancel sent to a node that does not execute a run stops it.
//
// Which node executed a run: every node gets a model server of its own
// (EPHEMERAL_OPENAI_BASE_URL), so the server that received a run's first
// model request (the prompt carries a tag naming the run) names the
// executing node. The API itself does not say which node executed a run.
// That is also how "executed once" is checked: a run executed twice would
// make a second first request.
func TestManyHosts(t *testing.T) {
	requireVM(t)
	// A cluster of the test's own, not pgtest.Shared: Shared needs
	// pgtest.RunMain in TestMain, which exits before TestMain's own
	// clean-up could run.
	pg := pgtest.Start(t)
	dbURL := pg.NewDatabase(t)
	secret := randomHex(32)
	// The admin CLI and the daemons read the same settings; createOrg runs
	// the CLI with the test's environment.
	t.Setenv("EPHEMERAL_DATABASE", dbURL)
	t.Setenv("EPHEMERAL_SECRET_KEY", secret)

	states := map[string]string{"A": cliState(t), "B": cliState(t), "C": cliState(t)}
	key := createOrg(t, states["A"]) // acme, $5
	const maxCost = 40000
	// An organisation whose balance covers exactly ten runs.
	admin := func(args ...string) string {
		t.Helper()
		r := runCLI(t, states["B"], append([]string{"admin"}, args...)...)
		if r.code != 0 {
			t.Fatalf("admin %v: %s", args, r.stderr)
		}
		return strings.TrimSpace(r.stdout)
	}
	admin("org", "create", "bulk")
	admin("member", "add", "--org", "bulk", "ops@bulk.example")
	bulkKey := admin("key", "create", "--org", "bulk", "--member", "ops@bulk.example")
	admin("credit", "--org", "bulk", "--micros", fmt.Sprint(10*maxCost))

	models := &clusterModel{}
	env := func(name string) []string {
		srv := httptest.NewServer(models.handler(name))
		t.Cleanup(srv.Close)
		return []string{
			"EPHEMERAL_DATABASE=" + dbURL, "EPHEMERAL_SECRET_KEY=" + secret,
			"EPHEMERAL_NODE_LEASE=3s", "EPHEMERAL_MAX_CONCURRENT_RUNS=1", "EPHEMERAL_POOL_SIZE=0",
			"EPHEMERAL_MAX_ACTIVE_RUNS_PER_ORG=100",
			// The test is one client making many requests.
			"EPHEMERAL_LIMIT_KEY_RUN_CREATIONS=500", "EPHEMERAL_LIMIT_ADDRESS_RUN_CREATIONS=500",
			"EPHEMERAL_LIMIT_KEY_READS=5000", "EPHEMERAL_LIMIT_ADDRESS_READS=5000",
			"EPHEMERAL_OPENAI_BASE_URL=" + srv.URL + "/v1", "EPHEMERAL_OPENAI_API_KEY=" + manyHostsModelKey,
			"EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna",
		}
	}
	envs := map[string][]string{}
	nodes := map[string]daemon{}
	start := time.Now()
	for _, name := range []string{"A", "B", "C"} {
		envs[name] = env(name)
		nodes[name] = launchServe(t, states[name], key, envs[name]...)
	}
	t.Logf("three nodes up in %s", time.Since(start).Round(time.Millisecond))
	others := func(names ...string) []string {
		var out []string
		for _, n := range []string{"A", "B", "C"} {
			if !slices.Contains(names, n) {
				out = append(out, n)
			}
		}
		return out
	}
	submit := func(d daemon, tag string) apiRun {
		t.Helper()
		var created apiRun
		body := fmt.Sprintf(`{"prompt": "%s", "shell": true, "timeout_seconds": 300, "max_cost_micros": %d}`, tag, maxCost)
		if status := d.call(t, "POST", "/v1/runs", strings.NewReader(body), nil, &created); status != http.StatusCreated || created.ID == "" {
			t.Fatalf("POST /v1/runs %s: %d %+v", tag, status, created)
		}
		return created
	}

	// 1. Six runs created on A, executed across the cluster.
	phase := time.Now()
	ids := map[string]string{}
	for i := range 6 {
		tag := fmt.Sprintf("manyhosts-quick-%d", i)
		ids[tag] = submit(nodes["A"], tag).ID
	}
	byNode := map[string]int{}
	for tag, id := range ids {
		run, _ := nodes["A"].waitRun(t, id)
		if run.Status != "succeeded" || run.Output != "done" {
			t.Errorf("%s (%s): %s %+v, output %q", tag, id, run.Status, run.Error, run.Output)
		}
		ex := models.executors(tag)
		if len(ex) != 1 {
			t.Errorf("%s was executed by %v, want one node once", tag, ex)
			continue
		}
		byNode[ex[0]]++
	}
	t.Logf("six runs created on A ended in %s; runs executed per node: %v", time.Since(phase).Round(time.Millisecond), byNode)
	if len(byNode) < 2 {
		t.Errorf("all six runs were executed by one node: %v", byNode)
	}

	// 2. A live stream on another node than the executor. Streams are
	// opened on every node before any node takes the run; those of the
	// nodes that do not execute it are checked.
	phase = time.Now()
	ctx, cancelStreams := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancelStreams()
	streamRun := submit(nodes["A"], "manyhosts-stream")
	streams := map[string]*sseStream{}
	for _, n := range []string{"A", "B", "C"} {
		streams[n] = openStream(t, ctx, nodes[n], streamRun.ID, "")
	}
	exec := waitExecutor(t, models, "manyhosts-stream")
	watcher := others(exec)[0]
	resumer := others(exec)[1]
	var shellRunning sseEvent
	for e := range streams[watcher].events {
		if e.Category == "Shell" && e.state() == "running" {
			shellRunning = e
			break
		}
	}
	if shellRunning.Rev == 0 {
		t.Fatalf("node %s's stream ended without the running Shell entry: %v", watcher, streams[watcher].err())
	}
	var now apiRun
	nodes[resumer].call(t, "GET", "/v1/runs/"+streamRun.ID, nil, nil, &now)
	if now.Status != "running" {
		t.Errorf("the running Shell entry reached node %s's stream only once the run was %s: not live", watcher, now.Status)
	}
	t.Logf("node %s executes the streamed run; node %s's stream had the running Shell entry (rev %d) at t=%.2fs, while the run was %s",
		exec, watcher, shellRunning.Rev, shellRunning.T, now.Status)
	// Resume on the third node after that revision, while the run runs.
	resumed := openStream(t, ctx, nodes[resumer], streamRun.ID, fmt.Sprint(shellRunning.Rev))
	var later []sseEvent
	for e := range resumed.events {
		later = append(later, e)
	}
	if resumed.end != "succeeded" {
		t.Errorf("resumed stream on %s ended with %q (%v), want the end event with succeeded", resumer, resumed.end, resumed.err())
	}
	amended := false
	for i, e := range later {
		if e.Rev <= shellRunning.Rev || (i > 0 && e.Rev <= later[i-1].Rev) {
			t.Errorf("resumed after rev %d, got rev %d (%s %q)", shellRunning.Rev, e.Rev, e.Category, e.Message)
		}
		if e.ID == shellRunning.ID && e.state() == "done" {
			amended = true
		}
	}
	if !amended {
		t.Errorf("the resumed stream lacks the Shell entry %d amended as done: %+v", shellRunning.ID, later)
	}
	// The first watcher's stream goes on to the end too.
	var rest []sseEvent
	for e := range streams[watcher].events {
		rest = append(rest, e)
	}
	if streams[watcher].end != "succeeded" || len(rest) == 0 || rest[len(rest)-1].Category != "Worker destroyed" {
		t.Errorf("node %s's stream: end %q (%v), last entries %+v", watcher, streams[watcher].end, streams[watcher].err(), rest)
	}
	// Both end with the same entries in the same revisions (a live stream
	// may also have seen an entry's earlier revision).
	if got, want := lastRevs(rest), lastRevs(later); !maps.Equal(got, want) {
		t.Errorf("after rev %d node %s streamed entries %v, the resumed stream on %s %v", shellRunning.Rev, watcher, got, resumer, want)
	}
	run, _ := nodes[watcher].waitRun(t, streamRun.ID)
	if run.Status != "succeeded" {
		t.Errorf("streamed run: %s %+v", run.Status, run.Error)
	}
	t.Logf("streamed run ended in %s; %d entries resumed on %s after rev %d", time.Since(phase).Round(time.Millisecond), len(later), resumer, shellRunning.Rev)

	// 3. The node executing a run is killed: another ends the run as
	// node_lost within the lease.
	phase = time.Now()
	killRun := submit(nodes["A"], "manyhosts-kill")
	victim := waitExecutor(t, models, "manyhosts-kill")
	witness := others(victim)[0]
	waitShellRunning(t, nodes[witness], killRun.ID)
	sandboxes := filepath.Join(states[victim], "sandboxes")
	vmDirs := runningSandboxes(sandboxes)
	if len(vmDirs) != 1 {
		t.Fatalf("node %s executes the run, yet has sandboxes %v", victim, vmDirs)
	}
	victimID, err := os.ReadFile(filepath.Join(states[victim], "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	nodes[victim].cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	<-nodes[victim].done
	const lease = 3 * time.Second
	for {
		nodes[witness].call(t, "GET", "/v1/runs/"+killRun.ID, nil, nil, &run)
		if run.Status != "running" {
			break
		}
		if time.Since(killed) > 2*time.Minute {
			t.Fatalf("the killed node's run is still running %s later", time.Since(killed))
		}
		time.Sleep(50 * time.Millisecond)
	}
	delay := time.Since(killed)
	t.Logf("node %s (%s) killed with SIGKILL; node %s saw its run %s %s later (lease %s)",
		victim, strings.TrimSpace(string(victimID)), witness, run.Status, delay.Round(time.Millisecond), lease)
	if bound := lease + lease/4 + 20*time.Second; delay > bound {
		t.Errorf("the lost node's run ended %s after the kill, past %s", delay, bound)
	}
	run, events := nodes[witness].waitRun(t, killRun.ID)
	if run.Status != "failed" || run.Error == nil || run.Error.Code != "node_lost" {
		t.Errorf("the killed node's run: %s, error %+v", run.Status, run.Error)
	}
	if run.Cost.Reserved != maxCost || run.Cost.Charged != run.Cost.Model+run.Cost.Web+run.Cost.Compute ||
		run.Cost.Charged+run.Cost.Released != run.Cost.Reserved || run.Cost.Model == 0 {
		t.Errorf("the lost run's cost: %+v", run.Cost)
	}
	namesNode, ready := false, 0
	for _, e := range events {
		if e.Category == "Failed" && strings.Contains(e.Message, strings.TrimSpace(string(victimID))) {
			namesNode = true
		}
		if e.Category == "MicroVM" && e.Message == "microVM ready" {
			ready++
		}
	}
	if !namesNode || ready != 1 {
		t.Errorf("the lost run's timeline: Failed entry naming %s %v, %d \"microVM ready\" entries: %+v", victimID, namesNode, ready, events)
	}
	checkWhole(t, nodes[witness], 5_000_000)

	// The guest powers off when its daemon is gone; the restarted node
	// sweeps what is left of the sandbox.
	for deadline := time.Now().Add(time.Minute); len(vmmProcesses(sandboxes)) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the VMM outlived its daemon by a minute: %v", vmmProcesses(sandboxes))
		}
		time.Sleep(100 * time.Millisecond)
	}
	restart := time.Now()
	nodes[victim] = launchServe(t, states[victim], key, envs[victim]...)
	t.Logf("node %s restarted in %s", victim, time.Since(restart).Round(time.Millisecond))
	if _, err := os.Stat(vmDirs[0]); !os.IsNotExist(err) {
		t.Errorf("the lost run's sandbox %s survived the restart: %v", vmDirs[0], err)
	}
	if pids := vmmProcesses(sandboxes); len(pids) > 0 {
		t.Errorf("VMM processes survived the restart: %v", pids)
	}
	var after apiRun
	nodes[victim].call(t, "GET", "/v1/runs/"+killRun.ID, nil, nil, &after)
	if after.Status != run.Status || after.Error == nil || after.Error.Code != "node_lost" || after.Cost != run.Cost {
		t.Errorf("the restart changed the lost run: %s %+v %+v, was %+v", after.Status, after.Error, after.Cost, run.Cost)
	}
	checkWhole(t, nodes[victim], 5_000_000)
	t.Logf("kill phase took %s", time.Since(phase).Round(time.Millisecond))

	// 4. Fifty concurrent creations over the three nodes against a balance
	// that covers ten.
	phase = time.Now()
	bulk := map[string]daemon{}
	for n, d := range nodes {
		d.key = bulkKey
		bulk[n] = d
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		codes    = map[string]int{}
		created  []string
		problems []string
	)
	gate := make(chan struct{})
	for i := range 50 {
		d := bulk[[]string{"A", "B", "C"}[i%3]]
		body := fmt.Sprintf(`{"prompt": "manyhosts-bulk-%d", "shell": true, "timeout_seconds": 60, "max_cost_micros": %d}`, i, maxCost)
		wg.Go(func() {
			<-gate
			status, _, raw, err := d.do("POST", "/v1/runs", body, nil)
			var resp struct {
				ID    string `json:"id"`
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			json.Unmarshal(raw, &resp)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				problems = append(problems, err.Error())
				return
			}
			statuses[status]++
			codes[resp.Error.Code]++
			if status == http.StatusCreated {
				created = append(created, resp.ID)
			}
		})
	}
	// The balance, sampled on every node while the creations race.
	sampling := make(chan struct{})
	var samples []string
	nSamples := 0
	var sampled sync.WaitGroup
	sampled.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-sampling:
				return
			default:
			}
			b, err := bulk[[]string{"A", "B", "C"}[i%3]].balance()
			mu.Lock()
			nSamples++
			if err != nil {
				problems = append(problems, err.Error())
			} else if b.Available+b.Held+b.Charged != b.Credited || b.Credited != 10*maxCost || b.Available < 0 {
				samples = append(samples, fmt.Sprintf("%+v", b))
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	})
	storm := time.Now()
	close(gate)
	wg.Wait()
	t.Logf("50 concurrent POST /v1/runs over three nodes answered in %s: statuses %v, error codes %v",
		time.Since(storm).Round(time.Millisecond), statuses, codes)
	if len(problems) > 0 {
		t.Errorf("requests failed: %v", problems)
	}
	if statuses[http.StatusCreated] != 10 || statuses[http.StatusPaymentRequired] != 40 || codes["insufficient_balance"] != 40 {
		t.Errorf("want 10 created and 40 refused with 402 insufficient_balance, got statuses %v, codes %v", statuses, codes)
	}
	b, err := bulk["C"].balance()
	if err != nil || b.Available != 0 || b.Held+b.Charged != 10*maxCost {
		t.Errorf("balance after ten creations: %+v %v", b, err)
	}
	// The ten are canceled at once, each on another node than it was
	// created on, whether queued, booting or running.
	var cancels sync.WaitGroup
	for i, id := range created {
		d := bulk[[]string{"A", "B", "C"}[(i+1)%3]]
		cancels.Go(func() {
			status, _, raw, err := d.do("POST", "/v1/runs/"+id+"/cancel", "", nil)
			if err != nil || status != http.StatusOK {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("cancel %s: %d %s %v", id, status, raw, err))
				mu.Unlock()
			}
		})
	}
	cancels.Wait()
	var charged int64
	ended := map[string]int{}
	for _, id := range created {
		run, _ := bulk["A"].waitRun(t, id)
		ended[run.Status]++
		charged += run.Cost.Charged
		if run.Cost.Charged+run.Cost.Released != maxCost || run.Cost.Charged != run.Cost.Model+run.Cost.Web+run.Cost.Compute {
			t.Errorf("bulk run %s: %s, cost %+v", id, run.Status, run.Cost)
		}
	}
	close(sampling)
	sampled.Wait()
	if len(problems) > 0 {
		t.Errorf("requests failed: %v", problems)
	}
	if len(samples) > 0 {
		t.Errorf("balances that did not add up while runs were created and canceled: %v", samples)
	}
	// The refused requests left no run behind.
	var list struct {
		Data []apiRun `json:"data"`
	}
	bulk["C"].call(t, "GET", "/v1/runs?limit=100", nil, nil, &list)
	if len(list.Data) != len(created) {
		t.Errorf("the bulk organisation has %d runs, %d were created", len(list.Data), len(created))
	}
	if ended["canceled"]+ended["succeeded"] != len(created) {
		t.Errorf("the ten runs ended %v, want canceled (or succeeded, had one finished first)", ended)
	}
	b = checkWhole(t, bulk["B"], 10*maxCost)
	if b.Charged != charged {
		t.Errorf("bulk balance charged %d, its runs %d", b.Charged, charged)
	}
	t.Logf("the ten ended %v, %d µ$ charged in all, in %s; %d balance samples added up", ended, charged, time.Since(phase).Round(time.Millisecond), nSamples)

	// One Idempotency-Key sent to two nodes at once, then to a third.
	phase = time.Now()
	idemKey := "manyhosts-" + randomHex(8)
	idemBody := fmt.Sprintf(`{"prompt": "manyhosts-idem", "shell": true, "timeout_seconds": 300, "max_cost_micros": %d}`, maxCost)
	type answer struct {
		status   int
		id       string
		replayed string
		err      error
	}
	answers := make([]answer, 2)
	gate = make(chan struct{})
	for i, n := range []string{"A", "B"} {
		wg.Go(func() {
			<-gate
			status, header, raw, err := nodes[n].do("POST", "/v1/runs", idemBody, map[string]string{"Idempotency-Key": idemKey})
			var r apiRun
			json.Unmarshal(raw, &r)
			answers[i] = answer{status, r.ID, header.Get("Idempotent-Replayed"), err}
		})
	}
	close(gate)
	wg.Wait()
	status, header, raw, err := nodes["C"].do("POST", "/v1/runs", idemBody, map[string]string{"Idempotency-Key": idemKey})
	var third apiRun
	json.Unmarshal(raw, &third)
	got := []int{answers[0].status, answers[1].status}
	slices.Sort(got)
	if answers[0].err != nil || answers[1].err != nil || !slices.Equal(got, []int{http.StatusOK, http.StatusCreated}) ||
		answers[0].id == "" || answers[0].id != answers[1].id {
		t.Fatalf("one Idempotency-Key on A and B at once: %+v, want 201 and 200 with one run", answers)
	}
	if err != nil || status != http.StatusOK || third.ID != answers[0].id || header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the key again on C: %d %s %v, want 200 replaying %s", status, raw, err, answers[0].id)
	}
	t.Logf("Idempotency-Key on A and B at once: A %d, B %d, then C %d, one run %s", answers[0].status, answers[1].status, status, answers[0].id)
	if b := checkAddsUp(t, nodes["A"], 5_000_000); b.Held != maxCost {
		t.Errorf("one run reserved, yet %d held", b.Held)
	}
	// Cancel it on a node that does not execute it.
	idemExec := waitExecutor(t, models, "manyhosts-idem")
	waitShellRunning(t, nodes[idemExec], answers[0].id)
	canceler := others(idemExec)[0]
	var canceled apiRun
	asked := time.Now()
	if status := nodes[canceler].call(t, "POST", "/v1/runs/"+answers[0].id+"/cancel", nil, nil, &canceled); status != http.StatusOK || canceled.Status != "canceled" {
		t.Errorf("cancel on %s of the run %s executes: %d %s %+v", canceler, idemExec, status, canceled.Status, canceled.Error)
	}
	t.Logf("cancel on %s of the run executing on %s answered in %s", canceler, idemExec, time.Since(asked).Round(time.Millisecond))
	checkWhole(t, nodes["A"], 5_000_000)
	t.Logf("idempotency and cancel took %s", time.Since(phase).Round(time.Millisecond))

	// No run was executed twice, the lost one included (its node came
	// back and has served since).
	for tag, n := range models.firstRequests() {
		if n != 1 {
			t.Errorf("%s made %d first model requests, want 1", tag, n)
		}
	}
	t.Logf("whole test: %s", time.Since(start).Round(time.Millisecond))
}

const manyHostsModelKey = "sk-test-provider"

// clusterModel scripts the model for runs named by a tag in their prompt,
// whichever node asks; each node has a handler of its own, so that the
// requests say which node executed which run.
type clusterModel struct {
	mu       sync.Mutex
	requests []modelRequest
}

type modelRequest struct {
	node, tag string
	turn      int // 1 for a run's first model call
}

var runTag = regexp.MustCompile(`manyhosts-[a-z]+(-[0-9]+)?`)

func (m *clusterModel) handler(node string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 32<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		json.Unmarshal(body, &req)
		turn := 1
		for _, msg := range req.Messages {
			if msg.Role == "assistant" {
				turn++
			}
		}
		// The prompt comes before any tool result in the body.
		tag := runTag.FindString(string(body))
		m.mu.Lock()
		m.requests = append(m.requests, modelRequest{node, tag, turn})
		m.mu.Unlock()
		fake := fakeprovider.New(manyHostsTurn(tag, turn))
		fake.APIKey = manyHostsModelKey
		fake.ServeHTTP(w, r)
	})
}

// manyHostsTurn is the model's answer: one shell command first (none for
// the bulk runs), then "done".
func manyHostsTurn(tag string, turn int) fakeprovider.Turn {
	usage := fakeprovider.Usage{InputTokens: 1000, OutputTokens: 20}
	if turn == 1 {
		command := ""
		switch kind := strings.Split(tag, "-"); kind[1] {
		case "quick":
			command = "echo quick; uname -r"
		case "stream":
			command = "echo one; sleep 4; echo two"
		case "kill", "idem":
			command = "echo started; sleep 600"
		}
		if command != "" {
			return fakeprovider.Turn{ToolCalls: []fakeprovider.ToolCall{shellCall("call_1", command)}, Usage: usage}
		}
	}
	return fakeprovider.Turn{Text: "done", Usage: usage}
}

// executors lists the nodes that made tag's first model request, once per
// request.
func (m *clusterModel) executors(tag string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range m.requests {
		if r.tag == tag && r.turn == 1 {
			out = append(out, r.node)
		}
	}
	return out
}

// firstRequests counts each tag's first model requests.
func (m *clusterModel) firstRequests() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for _, r := range m.requests {
		if r.turn == 1 {
			out[r.tag]++
		}
	}
	return out
}

// waitExecutor waits for the run tagged tag to make its first model
// request and returns the node that made it.
func waitExecutor(t *testing.T, m *clusterModel, tag string) string {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if ex := m.executors(tag); len(ex) > 0 {
			return ex[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no node took %s", tag)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitShellRunning waits until the run's timeline has a Shell entry: its
// command runs in the microVM.
func waitShellRunning(t *testing.T, d daemon, id string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var page struct {
			Data []sseEvent `json:"data"`
		}
		d.call(t, "GET", "/v1/runs/"+id+"/events", nil, nil, &page)
		for _, e := range page.Data {
			if e.Category == "Shell" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command of run %s never started: %+v", id, page.Data)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// do is call for goroutines: it returns what went wrong instead of
// failing the test.
func (d daemon) do(method, path, body string, header map[string]string) (int, http.Header, []byte, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, d.url+path, r)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, raw, err
}

type apiBalance struct {
	Available int64 `json:"available_micros"`
	Held      int64 `json:"held_micros"`
	Charged   int64 `json:"charged_micros"`
	Credited  int64 `json:"credited_micros"`
}

func (d daemon) balance() (apiBalance, error) {
	var b apiBalance
	status, _, raw, err := d.do("GET", "/v1/balance", "", nil)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("GET /v1/balance: %d %s", status, raw)
	}
	if err == nil {
		err = json.Unmarshal(raw, &b)
	}
	return b, err
}

// checkAddsUp checks that what is available, held and charged adds up to
// what was credited.
func checkAddsUp(t *testing.T, d daemon, credited int64) apiBalance {
	t.Helper()
	b, err := d.balance()
	if err != nil {
		t.Fatal(err)
	}
	if b.Credited != credited || b.Available+b.Held+b.Charged != credited || b.Available < 0 || b.Held < 0 {
		t.Errorf("balance %+v does not add up to %d credited", b, credited)
	}
	return b
}

// checkWhole checks the balance of an organisation with no active run:
// nothing held, every micro-dollar available or charged.
func checkWhole(t *testing.T, d daemon, credited int64) apiBalance {
	t.Helper()
	b := checkAddsUp(t, d, credited)
	if b.Held != 0 {
		t.Errorf("%d still held with no run active: %+v", b.Held, b)
	}
	return b
}

// sseEvent is a timeline entry as the API sends it.
type sseEvent struct {
	ID       int64          `json:"id"`
	Rev      int64          `json:"rev"`
	T        float64        `json:"t"`
	Category string         `json:"category"`
	Message  string         `json:"message"`
	Data     map[string]any `json:"data"`
}

func (e sseEvent) state() string {
	s, _ := e.Data["state"].(string)
	return s
}

// lastRevs maps each entry's id to the last revision of it sent.
func lastRevs(events []sseEvent) map[int64]int64 {
	out := map[int64]int64{}
	for _, e := range events {
		out[e.ID] = max(out[e.ID], e.Rev)
	}
	return out
}

// sseStream is an open GET /v1/runs/{id}/events stream: its timeline
// events arrive on events, which is closed when the stream ends; end is
// then the status its end event carried.
type sseStream struct {
	events chan sseEvent
	end    string
	mu     sync.Mutex
	failed error
}

func (s *sseStream) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// openStream opens the run's event stream on d, resuming after
// lastEventID when it is not empty.
func openStream(t *testing.T, ctx context.Context, d daemon, id, lastEventID string) *sseStream {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", d.url+"/v1/runs/"+id+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("event stream of %s on %s: %d %s", id, d.url, resp.StatusCode, body)
	}
	s := &sseStream{events: make(chan sseEvent, 1000)}
	go func() {
		defer close(s.events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var event, data string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			case line == "":
				switch event {
				case "timeline":
					var e sseEvent
					if err := json.Unmarshal([]byte(data), &e); err != nil {
						s.mu.Lock()
						s.failed = fmt.Errorf("timeline event %q: %w", data, err)
						s.mu.Unlock()
						return
					}
					s.events <- e
				case "end":
					var end struct{ Status string }
					json.Unmarshal([]byte(data), &end)
					s.end = end.Status
					return
				}
				event, data = "", ""
			}
		}
		s.mu.Lock()
		s.failed = fmt.Errorf("stream ended without an end event: %v", sc.Err())
		s.mu.Unlock()
	}()
	return s
}
