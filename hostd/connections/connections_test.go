package connections

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/seal"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

func newRegistry(t *testing.T) (*Registry, *store.Store, string, string) {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "ephemeral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, err := seal.NewKey(bytes.Repeat([]byte{9}, 32))
	if err != nil {
		t.Fatal(err)
	}
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return NewRegistry(st, key), st, org.ID, filepath.Join(dir, "ephemeral.db")
}

func TestSecretsAreSealedAtRestAndOpenedOnLookup(t *testing.T) {
	r, st, org, dbPath := newRegistry(t)
	ctx := context.Background()
	base, _ := ParseBaseURL("https://crm.example.com/api/", false)
	const secret = "Bearer canary-5d1c0e"
	c := Connection{Name: "crm", BaseURL: base, Methods: []string{"GET", "HEAD"}, Headers: http.Header{"Authorization": {secret}}}
	if err := r.Add(ctx, org, c); err != nil {
		t.Fatal(err)
	}
	if err := r.Add(ctx, org, c); !errors.Is(err, store.ErrConnectionExists) {
		t.Errorf("adding it twice: %v", err)
	}
	got, err := r.Lookup(ctx, org, "crm")
	if err != nil {
		t.Fatal(err)
	}
	if got.Headers.Get("Authorization") != secret || got.BaseURL.String() != "https://crm.example.com/api" ||
		strings.Join(got.Methods, ",") != "GET,HEAD" {
		t.Errorf("lookup: %+v", got)
	}
	list, err := r.List(ctx, org)
	if err != nil || len(list) != 1 || strings.Join(list[0].HeaderNames, ",") != "Authorization" {
		t.Errorf("list: %+v, %v", list, err)
	}
	st.Checkpoint(ctx)
	for _, f := range []string{dbPath, dbPath + "-wal"} {
		if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte("canary-5d1c0e")) {
			t.Errorf("%s holds the secret in the clear", filepath.Base(f))
		}
	}
	if err := r.Remove(ctx, org, "crm"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Lookup(ctx, org, "crm"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("lookup after remove: %v", err)
	}
}

func TestAnotherOrganisationCannotLookUpAConnection(t *testing.T) {
	r, st, org, _ := newRegistry(t)
	ctx := context.Background()
	other, _ := st.CreateOrg(ctx, "globex")
	base, _ := ParseBaseURL("https://crm.example.com", false)
	r.Add(ctx, org, Connection{Name: "crm", BaseURL: base, Methods: []string{"GET"}, Headers: http.Header{}})
	if _, err := r.Lookup(ctx, other.ID, "crm"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("other org's lookup: %v", err)
	}
}

func TestParsing(t *testing.T) {
	for _, s := range []string{"http://x.test", "ftp://x.test", "https://", "https://u:p@x.test", "https://x.test/?q=1", "https://x.test/#f", "/relative"} {
		if _, err := ParseBaseURL(s, false); err == nil {
			t.Errorf("base URL %q accepted", s)
		}
	}
	if _, err := ParseBaseURL("http://127.0.0.1:8080", true); err != nil {
		t.Errorf("plain http with the test allowance: %v", err)
	}
	if m, err := ParseMethods("get, HEAD,GET"); err != nil || strings.Join(m, ",") != "GET,HEAD" {
		t.Errorf("methods: %v %v", m, err)
	}
	for _, s := range []string{"TRACE", "CONNECT", "GET,", "FOO"} {
		if _, err := ParseMethods(s); err == nil {
			t.Errorf("methods %q accepted", s)
		}
	}
	if name, value, err := ParseHeader("authorization:  Bearer abc "); err != nil || name != "Authorization" || value != "Bearer abc" {
		t.Errorf("header: %q %q %v", name, value, err)
	}
	for _, s := range []string{"no colon secretxyz", ": secretxyz", "X-A: a\r\nX-B: secretxyz", "Bad Name: secretxyz"} {
		_, _, err := ParseHeader(s)
		if err == nil {
			t.Errorf("header %q accepted", s)
		} else if strings.Contains(err.Error(), "secretxyz") {
			t.Errorf("error echoes the header: %v", err)
		}
	}
}
