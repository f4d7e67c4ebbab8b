package api

import (
	"context"
	"testing"
	"time"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// addConnection registers a connection the way `admin connection add`
// does, minus the secrets the API never reads.
func (h *harness) addConnection(orgID, name string, methods ...string) {
	h.t.Helper()
	err := h.store.AddConnection(context.Background(), store.ConnectionRecord{
		OrgID: orgID, Name: name, BaseURL: "https://" + name + ".example.com", Methods: methods,
		SealedHeaders: []byte("sealed"), CreatedAt: time.Now(),
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

func TestGrantsAreCheckedAgainstTheOrganisationsConnections(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	h.addConnection(h.orgID, "crm", "GET", "HEAD")
	otherOrg, _ := h.newOrg("globex", 0)
	h.addConnection(otherOrg, "billing", "GET")

	for _, c := range []struct {
		name, conns, code, param string
	}{
		{"unknown", `[{"name":"nope","methods":["GET"]}]`, "connection_not_found", "connections[0].name"},
		{"another organisation's", `[{"name":"billing","methods":["GET"]}]`, "connection_not_found", "connections[0].name"},
		{"more methods than allowed", `[{"name":"crm","methods":["GET","POST"]}]`, "method_not_allowed", "connections[0].methods[1]"},
		{"second grant unknown", `[{"name":"crm","methods":["HEAD"]},{"name":"x","methods":["GET"]}]`, "connection_not_found", "connections[1].name"},
	} {
		resp := h.do("POST", "/v1/runs", `{"prompt":"p","max_cost_micros":100,"connections":`+c.conns+`}`)
		var body struct{ Error apiError }
		resp.decode(t, &body)
		if resp.status != 400 || body.Error.Code != c.code || body.Error.Param != c.param {
			t.Errorf("%s: %d %+v, want 400 %s %s", c.name, resp.status, body.Error, c.code, c.param)
		}
	}
	run := h.createRun(`{"prompt":"p","max_cost_micros":100,"connections":[{"name":"crm","methods":["GET"]}]}`)
	if run.ID == "" {
		t.Fatal("a grant within the organisation's allowance was refused")
	}
}
