package examplecrm

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func get(t *testing.T, method, path string, auth bool) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	if auth {
		r.Header.Set("Authorization", "Bearer "+DemoToken)
	}
	w := httptest.NewRecorder()
	Handler().ServeHTTP(w, r)
	return w
}

func TestCustomersNeedTheInjectedToken(t *testing.T) {
	if w := get(t, "GET", "/v1/customers", false); w.Code != http.StatusUnauthorized {
		t.Errorf("without token: %d", w.Code)
	}
	w := get(t, "GET", "/v1/customers?country=de", true)
	var body struct{ Customers []Customer }
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != 200 {
		t.Fatalf("list: %d %q %v", w.Code, w.Body, err)
	}
	if len(body.Customers) == 0 {
		t.Fatal("no German customers")
	}
	for _, c := range body.Customers {
		if c.Country != "DE" {
			t.Errorf("country filter let through %+v", c)
		}
	}
}

func TestCustomerByIDAndReadOnly(t *testing.T) {
	w := get(t, "GET", "/v1/customers/3", true)
	var c Customer
	json.Unmarshal(w.Body.Bytes(), &c)
	if w.Code != 200 || c.ID != 3 || c.Name == "" {
		t.Errorf("customer 3: %d %q", w.Code, w.Body)
	}
	if w := get(t, "GET", "/v1/customers/99", true); w.Code != http.StatusNotFound {
		t.Errorf("customer 99: %d", w.Code)
	}
	if w := get(t, "DELETE", "/v1/customers/3", true); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d", w.Code)
	}
	if c := Connection(); c.BaseURL.Host != Host || c.BaseURL.Scheme != "https" {
		t.Errorf("registration points at %s", c.BaseURL)
	}
}
