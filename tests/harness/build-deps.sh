#!/usr/bin/env bash
# Makes sure the host can build podstamp itself: `protoc`, from Debian's
# `protobuf-compiler` package, which the k8s-cri crate's build script runs to
# generate the container runtime's CRI bindings (host/src/daemon/cri/) from
# the CRI's api.proto. Installs it with apt-get when it is missing and this
# runs as root, unless PODSTAMP_NO_INSTALL=1; otherwise fails in one line
# saying how to install it.
set -euo pipefail

# shellcheck source=tests/harness/debian-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"

[[ -n "${PROTOC:-}" && -x "${PROTOC}" ]] && exit 0
need_debian_packages build-deps.sh protobuf-compiler \
  "install it with: sudo apt-get install protobuf-compiler (or set PROTOC to a protoc binary)" \
  protoc
