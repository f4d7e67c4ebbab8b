package chspec

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/internal/testenv"
)

func loadForTest(t *testing.T) *Contract {
	t.Helper()
	c, err := Load(context.Background(), testenv.SharedReference(t, FileName))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestValidateRequest(t *testing.T) {
	contract := loadForTest(t)
	tests := []struct {
		name, method, path, body string
		// wantErr is a fragment of the violation, empty for a valid request.
		wantErr string
	}{
		{"minimal create", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k"}}`, ""},
		{"boot without body", "PUT", "/api/v1/vm.boot", "", ""},
		{"ping", "GET", "/api/v1/vmm.ping", "", ""},
		{"misspelt field", "PUT", "/api/v1/vm.create", `{"payload":{"kernal":"/k"}}`, "kernal"},
		{"missing payload", "PUT", "/api/v1/vm.create", `{"cpus":{"boot_vcpus":1,"max_vcpus":1}}`, "payload"},
		{"reserved vsock cid", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k"},"vsock":{"cid":2,"socket":"/s"}}`, "cid"},
		{"unknown console mode", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k"},"console":{"mode":"tty"}}`, "mode"},
		{"create without body", "PUT", "/api/v1/vm.create", "", "body"},
		{"body on boot", "PUT", "/api/v1/vm.boot", `{}`, "body"},
		{"wrong method", "GET", "/api/v1/vm.create", "", "no such operation"},
		{"unknown endpoint", "PUT", "/api/v1/vm.explode", "", "no such operation"},
		{"missing prefix", "GET", "/vmm.ping", "", "no such operation"},
		// net_fds is an erratum: v53 accepts it, its description omits it.
		{"restore with net fds", "PUT", "/api/v1/vm.restore", `{"source_url":"file:///s","net_fds":[{"id":"net0","num_fds":1}]}`, ""},
		{"restore with misspelt net fds", "PUT", "/api/v1/vm.restore", `{"source_url":"file:///s","net_fds":[{"id":"net0","numfds":1}]}`, "numfds"},
		{"restore net fds without id", "PUT", "/api/v1/vm.restore", `{"source_url":"file:///s","net_fds":[{"num_fds":1}]}`, "id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := http.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.body != "" {
				r.Header.Set("Content-Type", "application/json")
			}
			err = contract.ValidateRequest(context.Background(), r, []byte(tt.body))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("valid request rejected: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Errorf("invalid request accepted, want a violation naming %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("violation %q does not name %q", err, tt.wantErr)
			}
		})
	}
}

func TestValidateResponse(t *testing.T) {
	contract := loadForTest(t)
	r, err := http.NewRequest("GET", "/api/v1/vm.info", nil)
	if err != nil {
		t.Fatal(err)
	}
	json := http.Header{"Content-Type": {"application/json"}}
	valid := `{"state":"Running","config":{"payload":{"kernel":"/k"}}}`
	if err := contract.ValidateResponse(context.Background(), r, 200, json, []byte(valid)); err != nil {
		t.Errorf("valid vm.info answer rejected: %v", err)
	}
	for _, body := range []string{`{"state":"Booting","config":{"payload":{}}}`, `{"state":"Running"}`} {
		if err := contract.ValidateResponse(context.Background(), r, 200, json, []byte(body)); err == nil {
			t.Errorf("invalid vm.info answer %s accepted", body)
		}
	}
	if err := contract.ValidateResponse(context.Background(), r, 418, json, nil); err == nil {
		t.Error("undeclared status 418 accepted")
	}
}
