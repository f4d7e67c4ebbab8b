package system

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/auth"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// daemonProcess is a running blockingserve.
type daemonProcess struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

var listenLine = regexp.MustCompile(`addr=(127\.0\.0\.1:\d+)`)

func startDaemon(t *testing.T, bin, stateDir, reconciled string) *daemonProcess {
	t.Helper()
	cmd := exec.Command(bin, "-state-dir", stateDir, "-reconciled", reconciled)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &daemonProcess{cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log("daemon: ", sc.Text())
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	select {
	case a := <-addr:
		p.url = "http://" + a
	case <-p.done:
		t.Fatal("daemon exited before serving")
	}
	return p
}

func (p *daemonProcess) call(t *testing.T, method, path, key, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, p.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

type runView struct {
	ID     string
	Status string
	Error  *struct{ Code, Message string }
	Cost   struct {
		Reserved int64 `json:"reserved_micros"`
		Charged  int64 `json:"charged_micros"`
		Released int64 `json:"released_micros"`
		Model    int64 `json:"model_micros"`
		Compute  int64 `json:"compute_micros"`
	}
}

// TestSIGKILLMidRunSettlesAtRestart kills a real daemon process while a run
// is executing, restarts it on the same state directory and checks that the
// run ended as failed, its metered cost was charged and the rest released,
// and its sandbox was handed to the reconcile hook.
func TestSIGKILLMidRunSettlesAtRestart(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go tool in PATH to build the daemon under test")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "blockingserve")
	build := exec.Command(goBin, "build", "-o", bin, "./testdata/blockingserve")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	stateDir := filepath.Join(dir, "state")
	key := seedOrg(t, stateDir, 1_000_000)
	reconciled := filepath.Join(dir, "reconciled")

	first := startDaemon(t, bin, stateDir, reconciled)
	var run runView
	if st := first.call(t, "POST", "/v1/runs", key, `{"prompt":"block","shell":true,"max_cost_micros":40000}`, &run); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	// Wait until the run has metered its usage (persisted as it is charged).
	for deadline := time.Now().Add(30 * time.Second); ; {
		var cur runView
		first.call(t, "GET", "/v1/runs/"+run.ID, key, "", &cur)
		if cur.Status == "running" && cur.Cost.Compute > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run never started metering: %+v", cur)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	if _, err := os.Stat(reconciled); !os.IsNotExist(err) {
		t.Fatalf("reconcile ran before the restart: %v", err)
	}

	second := startDaemon(t, bin, stateDir, reconciled)
	// A third daemon on the same state directory must refuse to start
	// rather than "recover" the second one's runs.
	thirdCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(thirdCtx, bin, "-state-dir", stateDir, "-reconciled", reconciled).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "another daemon is serving") {
		t.Fatalf("second daemon on one state dir: %v %s", err, out)
	}
	var after runView
	second.call(t, "GET", "/v1/runs/"+run.ID, key, "", &after)
	if after.Status != "failed" || after.Error == nil || after.Error.Code != "daemon_restarted" {
		t.Fatalf("after restart: %+v", after)
	}
	const metered = 500 + 5*240 // model + 5 VM-seconds
	if after.Cost.Charged != metered || after.Cost.Released != 40000-metered || after.Cost.Model+after.Cost.Compute != metered {
		t.Fatalf("cost after restart %+v, want %d charged", after.Cost, metered)
	}
	var balance struct {
		Available int64 `json:"available_micros"`
		Held      int64 `json:"held_micros"`
		Charged   int64 `json:"charged_micros"`
	}
	second.call(t, "GET", "/v1/balance", key, "", &balance)
	if balance.Held != 0 || balance.Charged != metered || balance.Available != 1_000_000-metered {
		t.Fatalf("balance %+v", balance)
	}
	ids, err := os.ReadFile(reconciled)
	if err != nil || string(ids) != run.ID {
		t.Fatalf("reconciled %q (%v), want %s", ids, err, run.ID)
	}
	var events struct {
		Data []struct {
			Category, Message string
			Data              struct{ State, Error string }
		}
	}
	second.call(t, "GET", "/v1/runs/"+run.ID+"/events", key, "", &events)
	n := len(events.Data)
	if n < 2 || events.Data[n-2].Category != "Failed" || !strings.Contains(events.Data[n-2].Message, "daemon stopped") ||
		events.Data[n-1].Message != "$0.0017 charged, $0.0383 released" {
		t.Fatalf("timeline %+v", events.Data)
	}
	// The command that was running when the daemon died is not shown
	// running for ever.
	shell := 0
	for _, e := range events.Data {
		if e.Category != "Shell" {
			continue
		}
		shell++
		if e.Message != "$ sleep infinity" || e.Data.State != "interrupted" || e.Data.Error == "" {
			t.Errorf("command entry after restart: %+v", e)
		}
	}
	if shell != 1 {
		t.Errorf("%d command entries, want 1: %+v", shell, events.Data)
	}
	// A graceful stop of the second daemon ends cleanly.
	second.cmd.Process.Signal(syscall.SIGTERM)
	<-second.done
	if code := second.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("graceful shutdown exit code %d", code)
	}
}

func seedOrg(t *testing.T, stateDir string, credit int64) string {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, DatabasePath(stateDir))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	o, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.AddMember(ctx, o.ID, "dev@acme.test")
	if err != nil {
		t.Fatal(err)
	}
	k := auth.NewKey()
	if err := st.AddKey(ctx, m, k.ID, k.Hash); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, o.ID, credit); err != nil {
		t.Fatal(err)
	}
	return k.Secret
}
