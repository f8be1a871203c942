#!/usr/bin/env bash
# Makes sure the host can run a test node (tests/kubelet.rs, podstamp-node):
# containerd, runc and a static busybox from the Debian packages, and root
# (containerd and the kubelet mount and create cgroups). Installs the
# packages with apt-get when they are missing and this runs as root, unless
# PODSTAMP_NO_INSTALL=1; otherwise fails saying how to install them.
set -euo pipefail

packages="containerd runc busybox-static"
hint="install them with: sudo apt-get install $packages"

if [[ "$(id -u)" != 0 ]]; then
  echo "node-deps.sh: error: the kubelet tests (tests/kubelet.rs) need root: containerd and the kubelet mount filesystems and create cgroups" >&2
  exit 1
fi

missing() {
  local out=()
  for tool in containerd containerd-shim-runc-v2 ctr runc; do
    command -v "$tool" >/dev/null 2>&1 || out+=("$tool")
  done
  [[ -x /bin/busybox ]] || out+=("/bin/busybox")
  echo "${out[*]}"
}

gone="$(missing)"
[[ -z "$gone" ]] && exit 0
if [[ "${PODSTAMP_NO_INSTALL:-}" == 1 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "node-deps.sh: error: missing $gone; $hint" >&2
  exit 1
fi
echo "node-deps.sh: missing $gone: installing the Debian packages $packages" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends $packages >&2; then
  apt-get update >&2
  apt-get install -y --no-install-recommends $packages >&2
fi
gone="$(missing)"
if [[ -n "$gone" ]]; then
  echo "node-deps.sh: error: still missing $gone after installing $packages" >&2
  exit 1
fi
