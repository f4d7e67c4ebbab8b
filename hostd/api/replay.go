package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// checkReplay makes sure a replay run asks what the example's recording
// answers: the recorded model turns only fit the prompt, model, tools,
// connections and files they were recorded with, and a replay that
// diverges would fail halfway, after its budget was spent on a microVM.
// Timeout, budget and zero data retention may differ. A request that
// names no model gets the recording's, whatever the daemon's default.
func (s *Server) checkReplay(c *canonicalRequest) *apiError {
	var recorded json.RawMessage
	var model string
	ok := false
	if s.exampleRequest != nil {
		recorded, model, ok = s.exampleRequest(c.Replay)
	}
	if !ok {
		return badParam("replay", "replay_not_found", fmt.Sprintf("there is no example %q to replay", c.Replay))
	}
	var req runRequest
	dec := json.NewDecoder(bytes.NewReader(recorded))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return &apiError{Status: http.StatusInternalServerError, Type: internal, Code: "internal_error",
			Message: fmt.Sprintf("the example %q has an unreadable request", c.Replay)}
	}
	req.Replay = &c.Replay
	// An example that names no model ran with the model of its recording,
	// whatever this daemon's default is.
	if req.Model == nil {
		req.Model = &model
	}
	want, apiErr := req.validate(s.lim)
	if apiErr != nil {
		return &apiError{Status: http.StatusInternalServerError, Type: internal, Code: "internal_error",
			Message: fmt.Sprintf("the example %q has an invalid request: %s", c.Replay, apiErr.Message)}
	}
	if c.Model == "" {
		c.Model = want.Model
	}
	field := ""
	switch {
	case c.Prompt != want.Prompt:
		field = "prompt"
	case c.Model != want.Model:
		field = "model"
	case c.Shell != want.Shell:
		field = "shell"
	case c.Web != want.Web:
		field = "web"
	case !slices.EqualFunc(c.Connections, want.Connections, func(a, b runs.Connection) bool {
		return a.Name == b.Name && slices.Equal(a.Methods, b.Methods)
	}):
		field = "connections"
	case !slices.Equal(c.Files, want.Files):
		field = "files"
	}
	if field != "" {
		return badParam(field, "replay_mismatch", fmt.Sprintf("a replay of %q must keep the example's %s: its recorded model "+
			"turns answer only the recorded request (leave out replay to run your own request live)", c.Replay, field))
	}
	return nil
}
