#!/usr/bin/env bash
# Makes sure the host can run a test node (tests/kubelet.rs, podstamp-node):
# containerd, runc and a static busybox from the Debian packages, and root
# (containerd and the kubelet mount and create cgroups). Installs the
# packages with apt-get when they are missing and this runs as root, unless
# PODSTAMP_NO_INSTALL=1; otherwise fails saying how to install them.
set -euo pipefail

# shellcheck source=tests/harness/debian-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"

if [[ "$(id -u)" != 0 ]]; then
  echo "node-deps.sh: error: the kubelet tests (tests/kubelet.rs) need root: containerd and the kubelet mount filesystems and create cgroups" >&2
  exit 1
fi
need_debian_packages node-deps.sh "containerd runc busybox-static" \
  "install them with: sudo apt-get install containerd runc busybox-static" \
  containerd containerd-shim-runc-v2 ctr runc /bin/busybox
