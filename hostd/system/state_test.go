package system

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ephemeralhq/ephemeral/hostd/config"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/seal"
)

// No local user but the daemon's may read the state directory, the
// database or the secret key, whatever the umask; an install an older
// version left open is closed when the daemon (or `ephemeral admin`)
// starts, while the guest image stays as it was built.
func TestStateIsTheOwnersAlone(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	ctx := context.Background()
	for name, open := range map[string]func(cfg config.Config) (*System, error){
		"serve": func(cfg config.Config) (*System, error) {
			return New(ctx, cfg, Options{Executor: executorFunc(func(context.Context, runs.Spec, *runs.Recorder) (runs.Result, error) {
				return runs.Result{}, nil
			})})
		},
		"admin": func(cfg config.Config) (*System, error) { return OpenStore(ctx, cfg, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := config.Defaults()
			cfg.StateDir = filepath.Join(t.TempDir(), "state")
			images := filepath.Join(cfg.StateDir, "images")
			if err := os.MkdirAll(images, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(cfg.StateDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(cfg.StateDir, seal.KeyFile), []byte(
				"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			sys, err := open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// A write brings the database's -wal and -shm files into being.
			if _, err := sys.Store.CreateOrg(ctx, "acme"); err != nil {
				t.Fatal(err)
			}
			defer sys.Close()
			db := DatabasePath(cfg.StateDir)
			for path, want := range map[string]os.FileMode{
				cfg.StateDir: 0o700,
				db:           0o600, db + "-wal": 0o600, db + "-shm": 0o600,
				filepath.Join(cfg.StateDir, seal.KeyFile): 0o600,
				images: 0o755,
			} {
				info, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if info.Mode().Perm() != want {
					t.Errorf("%s: mode %v, want %v", path, info.Mode().Perm(), want)
				}
			}
		})
	}
}

func TestStateDirMustNotBeShared(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.StateDir = dir
	if sys, err := OpenStore(context.Background(), cfg, nil); err == nil {
		sys.Close()
		t.Fatal("a sticky, world-writable directory was taken as the state directory")
	}
	if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o777 {
		t.Fatalf("the shared directory was changed: %v %v", info.Mode(), err)
	}
}
