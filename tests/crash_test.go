package tests

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/tests/fakeprovider"
)

// The daemon is killed with SIGKILL while a run's command is executing in
// its microVM. After a restart the run has ended as failed with a clear
// error, its hold is settled (metered cost charged, the rest released, the
// balance whole again), the model turn it made is in its recording, and
// nothing of its sandbox remains: no directory, VMM process, network
// namespace or VMM cgroup.
func TestDaemonKilledMidRun(t *testing.T) {
	state := cliState(t)
	fake := fakeprovider.New(fakeprovider.Turn{
		ToolCalls: []fakeprovider.ToolCall{shellCall("call_1", "echo started; sleep 600")},
		Usage:     fakeprovider.Usage{InputTokens: 1000, OutputTokens: 20},
	})
	fake.APIKey = "sk-test-provider"
	model := httptest.NewServer(fake)
	defer model.Close()
	env := []string{"EPHEMERAL_OPENAI_BASE_URL=" + model.URL + "/v1", "EPHEMERAL_OPENAI_API_KEY=" + fake.APIKey,
		"EPHEMERAL_DEFAULT_MODEL=openai/gpt-6-luna"}
	key := createOrg(t, state)
	// No pool: the run's sandbox is the one VM. TestDaemonKilledWithPool
	// kills a daemon with pooled sandboxes.
	first := launchServe(t, state, key, append(env, "EPHEMERAL_POOL_SIZE=0")...)

	var created apiRun
	first.call(t, "POST", "/v1/runs", strings.NewReader(`{"prompt": "sleep", "shell": true, "timeout_seconds": 300, "max_cost_micros": 40000}`),
		map[string]string{"Content-Type": "application/json"}, &created)
	if created.ID == "" {
		t.Fatalf("run not created: %+v", created)
	}

	// Kill the daemon once the command runs in the VM (and some compute has
	// been metered).
	sandboxes := filepath.Join(state, "sandboxes")
	var vmDirs []string
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var run apiRun
		first.call(t, "GET", "/v1/runs/"+created.ID, nil, nil, &run)
		vmDirs = runningSandboxes(sandboxes)
		if run.Usage.ShellCommands > 0 || (run.Status == "running" && run.Cost.Compute > 0 && len(vmDirs) == 1 && len(fake.Requests()) == 1) {
			break
		}
		if run.Status != "queued" && run.Status != "running" {
			t.Fatalf("run ended before the kill: %+v", run)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run's command never started: %+v", run)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(vmDirs) != 1 {
		t.Fatalf("want one sandbox with a VM while the run executes, got %v", vmDirs)
	}
	id := filepath.Base(vmDirs[0])
	cgroups := vmmCgroups(t)
	if !groupExists(cgroups, id) {
		t.Fatalf("the running sandbox %s has no VMM cgroup", id)
	}
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done

	// The guest powers off when its host hangs up, so the VMM of the dead
	// daemon exits by itself, before any restart.
	for deadline := time.Now().Add(time.Minute); len(vmmProcesses(sandboxes)) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the VMM outlived its daemon by a minute: %v", vmmProcesses(sandboxes))
		}
		time.Sleep(100 * time.Millisecond)
	}

	second := launchServe(t, state, key, append(env, "EPHEMERAL_POOL_SIZE=0")...)
	run, events := second.waitRun(t, created.ID)
	if run.Status != "failed" || run.Error == nil || run.Error.Code != "daemon_restarted" {
		t.Errorf("after restart: status %s, error %+v", run.Status, run.Error)
	}
	if run.Cost.Reserved != 40000 || run.Cost.Charged+run.Cost.Released != run.Cost.Reserved ||
		run.Cost.Model+run.Cost.Web+run.Cost.Compute != run.Cost.Charged || run.Cost.Compute == 0 {
		t.Errorf("cost after restart: %+v", run.Cost)
	}
	var balance struct {
		Available int64 `json:"available_micros"`
		Held      int64 `json:"held_micros"`
		Charged   int64 `json:"charged_micros"`
	}
	second.call(t, "GET", "/v1/balance", nil, nil, &balance)
	if balance.Held != 0 || balance.Charged != run.Cost.Charged || balance.Available+balance.Charged != 5_000_000 {
		t.Errorf("balance %+v after charging %d", balance, run.Cost.Charged)
	}
	if len(events) == 0 || !strings.HasPrefix(events[len(events)-1].Message, "$") {
		t.Errorf("timeline does not end with the settlement: %+v", events)
	}
	// The model turn made before the kill was recorded as it happened.
	var rec struct {
		Version   int   `json:"version"`
		Exchanges []any `json:"exchanges"`
	}
	if status := second.call(t, "GET", "/v1/runs/"+created.ID+"/recording", nil, nil, &rec); status != 200 || rec.Version != 2 || len(rec.Exchanges) != 1 {
		t.Errorf("recording after the crash: %d, version %d, %d exchanges", status, rec.Version, len(rec.Exchanges))
	}

	if _, err := os.Stat(filepath.Join(sandboxes, id)); !os.IsNotExist(err) {
		t.Errorf("sandbox directory %s survived the restart: %v", id, err)
	}
	if _, err := os.Stat("/run/netns/eph-" + id); !os.IsNotExist(err) {
		t.Errorf("network namespace of %s survived the restart: %v", id, err)
	}
	if pids := vmmProcesses(sandboxes); len(pids) > 0 {
		t.Errorf("VMM processes survived the restart: %v", pids)
	}
	if groupExists(cgroups, id) {
		t.Errorf("the VMM cgroup of %s survived the restart: %q", id, cgroups.Dirs(id))
	}
}

// A daemon killed while it keeps pooled sandboxes (and their template)
// leaves them to the next daemon, which sweeps all of them at start-up,
// VMM processes, network namespaces and VMM cgroups included.
func TestDaemonKilledWithPool(t *testing.T) {
	state := cliState(t)
	key := createOrg(t, state)
	first := launchServe(t, state, key, "EPHEMERAL_POOL_SIZE=2", "EPHEMERAL_MAX_CONCURRENT_RUNS=2")
	sandboxes := filepath.Join(state, "sandboxes")
	for deadline := time.Now().Add(3 * time.Minute); len(runningSandboxes(sandboxes)) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the pool never held two sandboxes: %v", runningSandboxes(sandboxes))
		}
		time.Sleep(100 * time.Millisecond)
	}
	firstDirs, _ := filepath.Glob(filepath.Join(sandboxes, "[0-9a-f]*"))
	cgroups := vmmCgroups(t)
	for _, dir := range runningSandboxes(sandboxes) {
		if id := filepath.Base(dir); !groupExists(cgroups, id) {
			t.Errorf("the pooled sandbox %s has no VMM cgroup", id)
		}
	}
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done

	launchServe(t, state, key, "EPHEMERAL_POOL_SIZE=0")
	for _, dir := range firstDirs {
		id := filepath.Base(dir)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("sandbox directory %s survived the restart: %v", id, err)
		}
		if _, err := os.Stat("/run/netns/eph-" + id); !os.IsNotExist(err) {
			t.Errorf("network namespace of %s survived the restart: %v", id, err)
		}
		if pids := vmmProcesses(dir); len(pids) > 0 {
			t.Errorf("VMM processes of %s survived the restart: %v", id, pids)
		}
		if groupExists(cgroups, id) {
			t.Errorf("the VMM cgroup of %s survived the restart: %q", id, cgroups.Dirs(id))
		}
	}
}

// runningSandboxes lists the sandbox directories in dir whose VMM is
// running (it wrote its pid file); a template's directory holds none.
func runningSandboxes(dir string) []string {
	pids, _ := filepath.Glob(filepath.Join(dir, "[0-9a-f]*", "vm", "pid"))
	var dirs []string
	for _, p := range pids {
		dirs = append(dirs, filepath.Dir(filepath.Dir(p)))
	}
	return dirs
}
