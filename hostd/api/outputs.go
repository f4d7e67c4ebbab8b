package api

import (
	"encoding/hex"
	"errors"
	"mime"
	"net/http"
	"path"
	"strconv"

	"github.com/ephemeralhq/ephemeral/hostd/outputs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// getOutput serves one of a run's output files. Its bytes came from code
// the run ran, maybe an HTML page with a script: it is served as an
// attachment, never sniffed into another type, and sandboxed should a
// browser render it anyway, so nothing it holds runs in the API's origin.
func (s *Server) getOutput(w http.ResponseWriter, r *http.Request, orgID string) {
	run, ok := s.loadRun(w, r, orgID)
	if !ok {
		return
	}
	name := r.PathValue("path")
	var o store.Output
	found := false
	switch {
	case outputs.CheckName(name) != "" || run.PurgedAt != nil:
	case run.ZeroRetention:
		o, found = s.runs.TakeVolatileFile(run.ID, name)
	default:
		var err error
		o, err = s.store.Output(r.Context(), run.ID, name)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.internalError(w, r, err)
			return
		}
		found = err == nil
	}
	if !found {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: invalidRequest, Code: "output_not_found", Param: "path",
			Message: "the run has no such output: it was not kept, its content was purged, or (zero data retention) it was downloaded already"})
		return
	}
	h := w.Header()
	h.Set("Content-Type", o.ContentType)
	h.Set("Content-Length", strconv.Itoa(len(o.Data)))
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(o.Path)}))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	h.Set("Cache-Control", "private, no-store")
	h.Set("ETag", `"sha256:`+hex.EncodeToString(o.SHA256)+`"`)
	w.WriteHeader(http.StatusOK)
	w.Write(o.Data) // a failed write means the client left; nothing to tell it
}
