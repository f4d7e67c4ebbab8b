#!/usr/bin/env bash
# Installs the Debian packages Ephemeral needs on the host: QEMU to boot
# microVMs, debootstrap/e2fsprogs/dpkg to build the guest image, chromium
# for the web app's browser tests, PostgreSQL for the many-hosts tests,
# which start throwaway clusters of their own (not the system cluster the
# package runs on port 5432), Node.js and npm (only where npx is missing)
# for the OpenAPI lint, and the unprivileged system user QEMU drops to
# once it has opened its devices and files. Idempotent: packages and the user already present are left alone,
# but the package lists are always refreshed because the image build
# downloads the current cloud kernel.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: run as root (sudo make ...): apt-get and the VM network need it" >&2
	exit 1
fi

packages=(qemu-system-x86 debootstrap e2fsprogs dpkg iproute2 ca-certificates chromium postgresql)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# make openapi-lint runs Redocly's CLI with npx. A machine that has Node.js
# from elsewhere (NodeSource's nodejs carries npm) keeps it; Debian's own
# comes in two packages.
if ! command -v npx >/dev/null; then
	missing+=(nodejs npm)
fi

export DEBIAN_FRONTEND=noninteractive
# A mirror hiccup should not fail a machine that already has everything:
# with every package present, stale lists only mean the image build may
# resolve a slightly older kernel (or use the one it has cached).
if ! apt-get update -q >/dev/null; then
	sleep 5
	if ! apt-get update -q >/dev/null; then
		if [ ${#missing[@]} -gt 0 ]; then
			echo "install-deps: apt-get update failed and ${missing[*]} must be installed" >&2
			exit 1
		fi
		echo "install-deps: warning: apt-get update failed; using the existing package lists" >&2
	fi
fi
if [ ${#missing[@]} -gt 0 ]; then
	echo "install-deps: installing ${missing[*]}"
	apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
# A guest that escapes into QEMU's device emulation lands in this user: no
# home, no shell, no files of its own. Keep the name in step with
# vmm/qemu's VMMUser.
vmm_user=ephemeral-vmm
if ! id -u "$vmm_user" >/dev/null 2>&1; then
	echo "install-deps: creating system user $vmm_user"
	useradd --system --user-group --no-create-home --home-dir /nonexistent \
		--shell /usr/sbin/nologin --comment "Ephemeral microVM monitor" "$vmm_user"
fi

echo "install-deps: ok (qemu: $(qemu-system-x86_64 --version | head -n1); vmm user: $vmm_user)"
