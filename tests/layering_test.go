package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/ephemeralhq/ephemeral/"

// goPackage is what `go list -json` says of a package.
type goPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Deps         []string
}

func listPackages(t *testing.T, args ...string) []goPackage {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-json"}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func under(pkg string, dirs ...string) bool {
	rel := strings.TrimPrefix(pkg, module)
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

// The lower layers (the wire protocol, network isolation, the VMM drivers,
// the guest) know nothing of the daemon: none of them, nor their tests,
// imports anything under hostd/ or tools/.
func TestLowerLayersDoNotImportTheDaemon(t *testing.T) {
	for _, p := range listPackages(t, "../...") {
		if !under(p.ImportPath, "vsockproto", "netns", "vmm", "guest", "internal") {
			continue
		}
		for _, imp := range append(append(p.Imports, p.TestImports...), p.XTestImports...) {
			if under(imp, "hostd", "tools", "tests") {
				t.Errorf("%s imports %s", strings.TrimPrefix(p.ImportPath, module), strings.TrimPrefix(imp, module))
			}
		}
	}
}

// The guest init is built into every VM: it depends on the guest's own
// packages and the wire protocol only, never on host-only code or the
// host's heavy libraries.
func TestGuestInitDependsOnGuestCodeOnly(t *testing.T) {
	hostOnly := []string{"modernc.org/sqlite", "github.com/google/nftables", "github.com/urfave/cli", "github.com/getkin/kin-openapi"}
	pkgs := listPackages(t, "-deps", "../guest/cmd/ephemeral-init")
	if len(pkgs) == 0 {
		t.Fatal("go list found no dependencies")
	}
	for _, p := range pkgs {
		if strings.HasPrefix(p.ImportPath, module) && !under(p.ImportPath, "guest", "vsockproto", "internal/cleanup") {
			t.Errorf("the guest init depends on %s", strings.TrimPrefix(p.ImportPath, module))
		}
		for _, h := range hostOnly {
			if strings.HasPrefix(p.ImportPath, h) {
				t.Errorf("the guest init depends on %s", p.ImportPath)
			}
		}
	}
}
