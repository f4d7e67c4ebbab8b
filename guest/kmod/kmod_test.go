package kmod

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseDepends(t *testing.T) {
	cases := []struct {
		modinfo string
		want    []string
	}{
		{"license=GPL\x00depends=virtio_ring,virtio,net_failover\x00", []string{"net_failover", "virtio", "virtio_ring"}},
		{"depends=\x00vermagic=6.1", nil},
		{"license=GPL", nil},
		{"depends=crc-t10dif", []string{"crc_t10dif"}},
	}
	for _, c := range cases {
		if got := parseDepends([]byte(c.modinfo)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("parseDepends(%q) = %q, want %q", c.modinfo, got, c.want)
		}
	}
}

// fakeKernel lays out a module directory like Debian's kernel package:
// empty .ko files plus modules.builtin. deps stands in for .modinfo.
func fakeKernel(t *testing.T, mods map[string][]string, builtin ...string) (string, func(string) ([]string, error)) {
	t.Helper()
	dir := t.TempDir()
	byPath := map[string][]string{}
	for name, d := range mods {
		p := filepath.Join(dir, "kernel", "drivers", name+".ko")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		byPath[p] = d
	}
	var b strings.Builder
	for _, name := range builtin {
		b.WriteString("kernel/fs/" + name + ".ko\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, func(p string) ([]string, error) { return byPath[p], nil }
}

func TestResolveOrdersDependenciesFirst(t *testing.T) {
	dir, deps := fakeKernel(t, map[string][]string{
		"virtio_ring":                {},
		"virtio":                     {},
		"virtio_net":                 {"net_failover", "virtio", "virtio_ring"},
		"net_failover":               {"failover"},
		"failover":                   {},
		"vsock":                      {},
		"vmw_vsock_virtio_transport": {"virtio", "vsock"},
	}, "ext4", "crc32c_generic")
	got, err := resolve(dir, []Want{
		{Name: "vmw_vsock_virtio_transport"},
		{Name: "virtio-net"},
		{Name: "ext4"},
		{Name: "virtio_pci", Optional: true},
	}, deps)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range got {
		names = append(names, m.Name)
	}
	want := []string{"virtio", "vsock", "vmw_vsock_virtio_transport", "failover", "net_failover", "virtio_ring", "virtio_net"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("order = %q, want %q", names, want)
	}
	if got[0].Path != filepath.Join("kernel", "drivers", "virtio.ko") {
		t.Errorf("path = %q, want it relative to the module directory", got[0].Path)
	}
}

func TestResolveErrors(t *testing.T) {
	dir, deps := fakeKernel(t, map[string][]string{
		"a":    {"b"},
		"b":    {"a"},
		"lone": {"missing"},
	})
	for _, w := range []Want{{Name: "a"}, {Name: "lone"}, {Name: "absent"}} {
		if _, err := resolve(dir, []Want{w}, deps); err == nil {
			t.Errorf("resolve(%s): no error", w.Name)
		}
	}
}

func TestOrderRoundTrip(t *testing.T) {
	mods := []Module{{Name: "virtio", Path: "kernel/drivers/virtio/virtio.ko"}, {Name: "vsock", Path: "kernel/net/vsock.ko"}}
	var buf bytes.Buffer
	if err := WriteOrder(&buf, mods); err != nil {
		t.Fatal(err)
	}
	got, err := ReadOrder(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{mods[0].Path, mods[1].Path}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadOrder = %q, want %q", got, want)
	}
	for _, bad := range []string{"/etc/passwd\n", "../../x.ko\n", "\n"} {
		if _, err := ReadOrder(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadOrder(%q): no error", bad)
		}
	}
}
