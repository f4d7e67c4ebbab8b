// Package chspec holds Cloud Hypervisor's published API description as an
// executable contract: it loads the OpenAPI document and checks HTTP
// requests and responses against it. The client's contract test and the
// fake cloud-hypervisor binary both judge traffic with it, so a request the
// real VMM would reject fails here first.
package chspec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// FileName is the API description of the Cloud Hypervisor release the
// client is written against. It is a reference document kept beside the
// repository, in shared/reference: tests find it with
// testenv.SharedReference; the fake VMM is given its path.
const FileName = "cloud-hypervisor-v53-openapi.yaml"

// Contract validates traffic against one loaded API description.
type Contract struct {
	router routers.Router
}

// Load parses the OpenAPI document at path. Object schemas that list their
// properties are closed (additionalProperties: false): the document leaves
// them open, but Cloud Hypervisor's serde structs ignore unknown fields
// silently, so a misspelt field would otherwise pass the contract and then
// do nothing in the real VMM.
func Load(ctx context.Context, path string) (*Contract, error) {
	loader := openapi3.NewLoader()
	loader.Context = ctx
	doc, err := loader.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("chspec: load %s: %w", path, err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("chspec: validate %s: %w", path, err)
	}
	if err := applyErrata(doc); err != nil {
		return nil, fmt.Errorf("chspec: %s: %w", path, err)
	}
	for _, ref := range doc.Components.Schemas {
		closeObjectSchema(ref.Value)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("chspec: build router: %w", err)
	}
	return &Contract{router: router}, nil
}

// applyErrata adds to doc what the released VMM accepts but its published
// description leaves out, each from the release's source:
//
//   - RestoreConfig.net_fds (vmm/src/config.rs of v53.0: RestoreConfig,
//     RestoredNetConfig {id, num_fds, fds}): the net devices of a restored
//     VM whose taps come with the request as SCM_RIGHTS descriptors, num_fds
//     of them each, in order (vmm/src/api/http/http_endpoint.rs attaches
//     them). fds in the body are ignored by the VMM.
func applyErrata(doc *openapi3.T) error {
	restore := doc.Components.Schemas["RestoreConfig"]
	if restore == nil || restore.Value == nil {
		return errors.New("no RestoreConfig schema to amend")
	}
	if _, ok := restore.Value.Properties["net_fds"]; ok {
		return nil // a later description has it
	}
	restoredNet := openapi3.NewObjectSchema().
		WithProperty("id", openapi3.NewStringSchema()).
		WithProperty("num_fds", openapi3.NewIntegerSchema().WithMin(0)).
		WithProperty("fds", openapi3.NewArraySchema().WithItems(openapi3.NewInt32Schema()))
	restoredNet.Required = []string{"id"}
	closeObjectSchema(restoredNet) // it is no component: Load would not close it
	restore.Value.WithProperty("net_fds", openapi3.NewArraySchema().WithItems(restoredNet))
	return nil
}

func closeObjectSchema(s *openapi3.Schema) {
	if s == nil || len(s.Properties) == 0 || s.AdditionalProperties.Has != nil || s.AdditionalProperties.Schema != nil {
		return
	}
	closed := false
	s.AdditionalProperties.Has = &closed
}

// ValidateRequest checks r, whose body has already been read into body,
// against the operation it addresses. Unknown paths and methods, missing or
// malformed bodies, and bodies sent to operations that take none are all
// violations.
func (c *Contract) ValidateRequest(ctx context.Context, r *http.Request, body []byte) error {
	input, err := c.requestInput(r, body)
	if err != nil {
		return err
	}
	if err := openapi3filter.ValidateRequest(ctx, input); err != nil {
		return fmt.Errorf("chspec: %s %s: %w", r.Method, r.URL.Path, err)
	}
	return nil
}

// ValidateResponse checks a response to r against the operation's declared
// status codes and schemas.
func (c *Contract) ValidateResponse(ctx context.Context, r *http.Request, status int, header http.Header, body []byte) error {
	input, err := c.requestInput(r, nil)
	if err != nil {
		return err
	}
	err = openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: input,
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true},
	})
	if err != nil {
		return fmt.Errorf("chspec: response %d to %s %s: %w", status, r.Method, r.URL.Path, err)
	}
	return nil
}

// requestInput routes a copy of r addressed the way the document's server
// URL expects (http://localhost/api/v1/...): a request read by a server
// carries only the path.
func (c *Contract) requestInput(r *http.Request, body []byte) (*openapi3filter.RequestValidationInput, error) {
	routed := r.Clone(context.Background())
	routed.URL.Scheme = "http"
	routed.URL.Host = "localhost"
	routed.Host = "localhost"
	routed.Body = io.NopCloser(bytes.NewReader(body))
	routed.ContentLength = int64(len(body))
	route, params, err := c.router.FindRoute(routed)
	if err != nil {
		return nil, fmt.Errorf("chspec: %s %s: no such operation: %w", r.Method, r.URL.Path, err)
	}
	return &openapi3filter.RequestValidationInput{
		Request:    routed,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			RejectWhenRequestBodyNotSpecified: true,
			AuthenticationFunc:                openapi3filter.NoopAuthenticationFunc,
		},
	}, nil
}
