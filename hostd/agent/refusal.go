package agent

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/ephemeralhq/ephemeral/hostd/model"
	"github.com/ephemeralhq/ephemeral/hostd/model/registry"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
)

// Error codes of a run that a model provider refused. No retry changes
// such an answer (the HTTP client does not retry them), so the run ends
// at once, and its timeline says what must be fixed.
const (
	codeProviderAuthFailed   = "provider_auth_failed"
	codeProviderAccessDenied = "provider_access_denied"
	codeModelNotFound        = "model_not_found"
)

// providerRefusal turns a provider's 401, 403 or 404 into the run's
// failure, in words that say who must fix what; nil for any other error.
func providerRefusal(m registry.Model, err error) *runs.Failure {
	var apiErr *model.APIError
	if !errors.As(err, &apiErr) {
		return nil
	}
	keySetting, urlSetting := "its API key", "its base URL"
	if k, u := registry.Settings(m.ProviderName); k != "" {
		keySetting, urlSetting = "the "+k+" setting", "the "+u+" setting"
	}
	f := &runs.Failure{Err: err}
	switch apiErr.StatusCode {
	case http.StatusUnauthorized:
		f.Code = codeProviderAuthFailed
		f.Message = fmt.Sprintf("the model provider %s rejected the daemon's API key (HTTP 401): "+
			"the daemon's operator must set a valid key in %s", m.ProviderName, keySetting)
	case http.StatusForbidden:
		f.Code = codeProviderAccessDenied
		f.Message = fmt.Sprintf("the model provider %s refused the daemon's API key access to model %s (HTTP 403): "+
			"the operator must give the key (%s) access to the model, or runs must name another model", m.ProviderName, m.Name, keySetting)
	case http.StatusNotFound:
		f.Code = codeModelNotFound
		f.Message = fmt.Sprintf("the model provider %s does not know model %s (HTTP 404): check the model name "+
			"(GET /v1/models lists them; the models-file setting declares more) and the provider's address, %s", m.ProviderName, m.Name, urlSetting)
	default:
		return nil
	}
	return f
}
