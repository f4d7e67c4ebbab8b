package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// resolveKernelPackage asks apt which versioned kernel package the cloud
// meta package currently depends on, e.g. linux-image-6.1.0-57-cloud-amd64
// at 6.1.192-3.
func resolveKernelPackage(ctx context.Context) (pkg, version string, err error) {
	meta, err := aptShow(ctx, KernelMetaPackage)
	if err != nil {
		return "", "", err
	}
	pkg, err = kernelDependency(meta["Depends"])
	if err != nil {
		return "", "", err
	}
	fields, err := aptShow(ctx, pkg)
	if err != nil {
		return "", "", err
	}
	if fields["Version"] == "" {
		return "", "", fmt.Errorf("image: apt-cache show %s: no Version field", pkg)
	}
	return pkg, fields["Version"], nil
}

// kernelPackagePattern matches the versioned image package in a Depends list.
var kernelPackagePattern = regexp.MustCompile(`^linux-image-[0-9][A-Za-z0-9.+-]*$`)

// kernelDependency picks the versioned kernel package out of the meta
// package's Depends field ("linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)").
func kernelDependency(depends string) (string, error) {
	for _, alt := range strings.Split(depends, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(alt), " ")
		if kernelPackagePattern.MatchString(name) {
			return name, nil
		}
	}
	return "", fmt.Errorf("image: %s depends on no linux-image package (Depends: %q)", KernelMetaPackage, depends)
}

// aptShow returns the fields of the candidate version of pkg.
func aptShow(ctx context.Context, pkg string) (map[string]string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "show", "--no-all-versions", pkg).Output()
	if err != nil {
		return nil, fmt.Errorf("image: apt-cache show %s: %w (is the apt index current? try `apt-get update`)", pkg, err)
	}
	return parseControl(out), nil
}

// parseControl reads the first stanza of Debian control-file output.
func parseControl(data []byte) map[string]string {
	fields := map[string]string{}
	var last string
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" {
			if len(fields) > 0 {
				break
			}
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last != "" {
				fields[last] += "\n" + strings.TrimSpace(line)
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		last = k
		fields[k] = strings.TrimSpace(v)
	}
	return fields
}

// extractKernel downloads the kernel package without installing it and
// keeps the bzImage, the release name and the module tree in dir.
func extractKernel(ctx context.Context, pkg, version, dir string) error {
	work, err := os.MkdirTemp("", "ephemeral-kernel-")
	if err != nil {
		return fmt.Errorf("image: kernel: %w", err)
	}
	defer os.RemoveAll(work)
	// apt drops privileges to _apt for downloads and needs to write here.
	if err := os.Chmod(work, 0o777); err != nil {
		return fmt.Errorf("image: kernel: %w", err)
	}
	dl := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg+"="+version)
	dl.Dir = work
	if out, err := dl.CombinedOutput(); err != nil {
		return fmt.Errorf("image: apt-get download %s=%s: %w\n%s", pkg, version, err, bytes.TrimSpace(out))
	}
	debs, _ := filepath.Glob(filepath.Join(work, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("image: apt-get download %s: expected one .deb, found %d", pkg, len(debs))
	}
	root := filepath.Join(work, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		return fmt.Errorf("image: dpkg-deb -x %s: %w\n%s", filepath.Base(debs[0]), err, bytes.TrimSpace(out))
	}
	releases, err := os.ReadDir(filepath.Join(root, "lib", "modules"))
	if err != nil || len(releases) != 1 {
		return fmt.Errorf("image: kernel package %s: expected one lib/modules/<release> (%v)", pkg, err)
	}
	release := releases[0].Name()
	if err := os.Rename(filepath.Join(root, "boot", "vmlinuz-"+release), filepath.Join(dir, kernelImageFile)); err != nil {
		return fmt.Errorf("image: kernel package %s: %w", pkg, err)
	}
	if err := os.Rename(filepath.Join(root, "lib", "modules", release), filepath.Join(dir, kernelModulesDir)); err != nil {
		return fmt.Errorf("image: kernel package %s: %w", pkg, err)
	}
	if err := os.WriteFile(filepath.Join(dir, kernelReleaseFile), []byte(release), 0o644); err != nil {
		return fmt.Errorf("image: kernel: %w", err)
	}
	return nil
}

// bootKernel is the kernel file VMs boot from a kernel part: the
// decompressed PVH ELF when the build could make one, else the bzImage.
func bootKernel(kernel cachedPart) string {
	if _, err := os.Stat(kernel.path(pvhKernelFile)); err == nil {
		return kernel.path(pvhKernelFile)
	}
	return kernel.path(kernelImageFile)
}
