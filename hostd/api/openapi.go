package api

import (
	_ "embed"
	"net/http"
)

// openAPIDocument describes this package's API; openapi_test.go checks the
// real handlers' requests and responses against it.
//
//go:embed openapi.json
var openAPIDocument []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openAPIDocument)
}
