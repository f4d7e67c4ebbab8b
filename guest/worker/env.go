package worker

import (
	"os"
	"path/filepath"
	"strings"
)

// DefaultPath is the PATH every guest command starts with.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// buildEnv returns the environment of a command run as acct: a fixed base
// (nothing of the init's own environment leaks in) with extra KEY=VALUE
// entries on top, later ones winning. Entries without "=" are dropped.
func buildEnv(acct Account, extra []string) []string {
	base := []string{
		"PATH=" + DefaultPath,
		"HOME=" + acct.Home,
		"USER=" + acct.Name,
		"LOGNAME=" + acct.Name,
		"LANG=C.UTF-8",
	}
	index := map[string]int{}
	var env []string
	for _, kv := range append(base, extra...) {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			continue
		}
		if i, seen := index[k]; seen {
			env[i] = kv
			continue
		}
		index[k] = len(env)
		env = append(env, kv)
	}
	return env
}

// envPath returns PATH from env.
func envPath(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds an executable the way a shell does: names with a slash
// are used as given, others are searched in path. It reports whether the
// file exists at all so that the caller can say "command not found".
func lookPath(name, path, dir string) (string, bool) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		_, err := os.Stat(p)
		return p, err == nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}
