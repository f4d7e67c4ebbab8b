// Package examplecrm is the example system a fresh install registers as a
// connection, so the playground's connection examples work offline: a
// small, read-only customer API with made-up data.
//
// It is never on the network. Its base URL names the reserved host
// example-crm.internal, which no resolver answers; the broker recognises
// that host and calls Handler in the daemon's own process (see
// broker.Config.InProcess). Everything else about the call — grants,
// methods, path checks, header stripping and injection, the timeline — is
// the same as for a real connection. The demo token proves that the
// broker injects stored headers; it is not a secret.
package examplecrm

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/ephemeralhq/ephemeral/hostd/connections"
)

// Host is the reserved host of the example's base URL.
const Host = "example-crm.internal"

// Name is the connection name the example is registered under.
const Name = "example-crm"

// DemoToken is the bearer token the example expects, stored (sealed) on
// the example connection like any real credential.
const DemoToken = "example-crm-demo-token"

// Connection is the example's registration: GET and HEAD under /v1.
func Connection() connections.Connection {
	return connections.Connection{
		Name:    Name,
		BaseURL: &url.URL{Scheme: "https", Host: Host, Path: "/v1"},
		Methods: []string{http.MethodGet, http.MethodHead},
		Headers: http.Header{"Authorization": {"Bearer " + DemoToken}},
	}
}

// Customer is one made-up customer.
type Customer struct {
	ID      int    `json:"id"`
	Name    string `json:"name"`
	Country string `json:"country"`
	Plan    string `json:"plan"`
	MRR     int    `json:"mrr_usd"`
}

var customers = []Customer{
	{1, "Ada Analytics GmbH", "DE", "enterprise", 4200},
	{2, "Bergfeld Logistik AG", "CH", "team", 890},
	{3, "Corvid Robotics Ltd", "GB", "team", 1250},
	{4, "Delta Fjord AS", "NO", "starter", 99},
	{5, "Elbe Health e.V.", "DE", "enterprise", 3100},
}

// Handler serves GET /v1/customers (optionally ?country=DE) and
// GET /v1/customers/{id}; it answers 401 without the demo token and 405 to
// anything but GET and HEAD.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/customers", func(w http.ResponseWriter, r *http.Request) {
		country := strings.ToUpper(r.URL.Query().Get("country"))
		list := []Customer{}
		for _, c := range customers {
			if country == "" || c.Country == country {
				list = append(list, c)
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"customers": list})
	})
	mux.HandleFunc("GET /v1/customers/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		for _, c := range customers {
			if err == nil && c.ID == id {
				writeJSON(w, http.StatusOK, c)
				return
			}
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such customer"})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+DemoToken {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong token"})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "read-only example"})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
