package api

import (
	"net/http"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
)

// modelJSON is one model of GET /v1/models.
type modelJSON struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	// Provider serves the model: "openai" (any Chat Completions server),
	// "anthropic", or a configured name.
	Provider string `json:"provider"`
	// ProviderConfigured is false when the daemon has no key or base URL
	// for the provider.
	ProviderConfigured bool `json:"provider_configured"`
	// Available: a run may use the model now (priced, provider configured).
	Available bool         `json:"available"`
	Price     *model.Price `json:"price"`
	Default   bool         `json:"default"`
}

// listModels serves GET /v1/models: every model the daemon knows, with
// its price and whether runs can use it. It needs no key: it is the price
// list, and the playground shows it before anyone signs in.
func (s *Server) listModels(w http.ResponseWriter, _ *http.Request) {
	page := struct {
		Object string      `json:"object"`
		Data   []modelJSON `json:"data"`
	}{Object: "list", Data: []modelJSON{}}
	if s.models != nil {
		for _, m := range s.models() {
			page.Data = append(page.Data, modelJSON{ID: m.Name, Object: "model", Provider: m.Provider,
				ProviderConfigured: m.ProviderConfigured, Available: m.Usable, Price: m.Price, Default: m.Name == s.lim.defaultModel})
		}
	}
	writeJSON(w, http.StatusOK, page)
}

// usableModels names the models of list that runs may use now.
func usableModels(list func() []registry.Status) []string {
	names := []string{}
	if list == nil {
		return names
	}
	for _, m := range list() {
		if m.Usable {
			names = append(names, m.Name)
		}
	}
	return names
}
