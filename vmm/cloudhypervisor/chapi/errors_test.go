package chapi

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/internal/fdhttp"
)

var errorBodyTests = []struct {
	name string
	body string
	want []string
}{
	{"chain", `["Error booting VM","Cannot load kernel","No such file or directory (os error 2)"]`,
		[]string{"Error booting VM", "Cannot load kernel", "No such file or directory (os error 2)"}},
	{"empty array", `[]`, []string{}},
	{"empty body", ``, nil},
	{"plain text", "Bad Request\n", []string{"Bad Request"}},
	{"object instead of array", `{"error":"x"}`, []string{`{"error":"x"}`}},
	{"long message", `["` + strings.Repeat("a", 2000) + `"]`, []string{strings.Repeat("a", maxErrorMessageSize-3) + "..."}},
	{"too many messages", `["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17","18"]`,
		[]string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "(3 more)"}},
}

func TestParseErrorBody(t *testing.T) {
	for _, tt := range errorBodyTests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseErrorBody([]byte(tt.body))
			if !slices.Equal(got, tt.want) {
				t.Errorf("parseErrorBody(%.40q) = %q, want %q", tt.body, got, tt.want)
			}
		})
	}
}

func FuzzParseErrorBody(f *testing.F) {
	for _, tt := range errorBodyTests {
		f.Add([]byte(tt.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		msgs := parseErrorBody(body)
		if len(msgs) > maxErrorMessages {
			t.Fatalf("%d messages, more than %d", len(msgs), maxErrorMessages)
		}
		for _, m := range msgs {
			if len(m) > maxErrorMessageSize {
				t.Fatalf("message of %d bytes, more than %d", len(m), maxErrorMessageSize)
			}
			if utf8.ValidString(string(body)) && !utf8.ValidString(m) {
				t.Fatalf("truncation split a UTF-8 sequence: %q", m)
			}
		}
		// Short, well-formed chains must arrive unchanged.
		var chain []string
		if json.Unmarshal(body, &chain) == nil && len(chain) <= maxErrorMessages &&
			!slices.ContainsFunc(chain, func(s string) bool { return len(s) > maxErrorMessageSize }) &&
			!slices.Equal(msgs, chain) {
			t.Fatalf("chain %q came back as %q", chain, msgs)
		}
	})
}

var infoTests = []struct {
	name    string
	body    string
	want    VMState
	wantErr bool
}{
	{"running", `{"state":"Running","config":{"payload":{"kernel":"/k"}}}`, StateRunning, false},
	{"created with extra fields", `{"state":"Created","config":{"payload":{},"iommu":false},"memory_actual_size":1}`, StateCreated, false},
	{"unknown state", `{"state":"Exploded","config":{"payload":{}}}`, "", true},
	{"no state", `{"config":{"payload":{}}}`, "", true},
	{"not json", `Running`, "", true},
	{"state not a string", `{"state":1}`, "", true},
}

func TestParseInfo(t *testing.T) {
	for _, tt := range infoTests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := parseInfo([]byte(tt.body))
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseInfo err = %v, wantErr %v", err, tt.wantErr)
			}
			if info.State != tt.want {
				t.Errorf("state = %q, want %q", info.State, tt.want)
			}
		})
	}
}

func FuzzParseInfo(f *testing.F) {
	for _, tt := range infoTests {
		f.Add([]byte(tt.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		info, err := parseInfo(body)
		if err == nil && !info.State.known() {
			t.Fatalf("accepted unknown state %q", info.State)
		}
		if err != nil && len(err.Error()) > 200+len(body) {
			t.Fatalf("error message of %d bytes", len(err.Error()))
		}
	})
}

func TestErrorNamesOperationAndQuotesVMMMessages(t *testing.T) {
	vmm := &recordingVMM{contract: loadContract(t), answers: map[string]fdhttp.Response{
		"PUT /api/v1/vm.boot": {Status: http.StatusInternalServerError, Body: []string{"Error booting VM", "Invalid \"kernel\"\n"}},
	}}
	client := startVMM(t, vmm)

	err := client.Boot(context.Background())

	want := `vm.boot: HTTP 500: "Error booting VM": "Invalid \"kernel\"\n"`
	if err == nil || err.Error() != want {
		t.Fatalf("Boot error = %v\nwant %s", err, want)
	}
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Operation != "vm.boot" || len(apiErr.Messages) != 2 {
		t.Errorf("error %#v is not the APIError of vm.boot with 2 messages", err)
	}
}

// silentVMM accepts connections and never answers, like a wedged VMM.
func silentVMM(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return sock
}

func TestCallTimeoutBoundsWedgedVMM(t *testing.T) {
	client := NewClient(silentVMM(t))
	client.CallTimeout = 50 * time.Millisecond

	_, err := client.Ping(context.Background())

	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "vmm.ping") {
		t.Fatalf("Ping on a wedged VMM: err = %v, want a deadline error naming vmm.ping", err)
	}
}

func TestCancelInterruptsCall(t *testing.T) {
	client := NewClient(silentVMM(t))
	client.CallTimeout = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- client.Boot(ctx) }()
	cancel()

	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Boot after cancel: err = %v, want context.Canceled", err)
	}
}

func TestMissingSocket(t *testing.T) {
	client := NewClient(filepath.Join(t.TempDir(), "absent.sock"))
	_, err := client.Info(context.Background())
	if err == nil || !strings.Contains(err.Error(), "vm.info") || !strings.Contains(err.Error(), "dial API socket") {
		t.Fatalf("Info without a VMM: err = %v, want a dial error naming vm.info", err)
	}
}
