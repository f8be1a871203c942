#!/usr/bin/env bash
# Makes sure the host can build podstamp itself: `protoc`, from Debian's
# `protobuf-compiler` package, which the k8s-cri crate's build script runs to
# generate the container runtime's CRI bindings (host/src/daemon/cri/) from
# the CRI's api.proto. Installs it with apt-get when it is missing and this
# runs as root, unless PODSTAMP_NO_INSTALL=1; otherwise fails in one line
# saying how to install it.
set -euo pipefail

packages="protobuf-compiler"
hint="install it with: sudo apt-get install protobuf-compiler (or set PROTOC to a protoc binary)"

[[ -n "${PROTOC:-}" && -x "${PROTOC}" ]] && exit 0
command -v protoc >/dev/null 2>&1 && exit 0
if [[ "${PODSTAMP_NO_INSTALL:-}" == 1 || "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "build-deps.sh: error: missing protoc; $hint" >&2
  exit 1
fi
echo "build-deps.sh: missing protoc: installing the Debian package $packages" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends $packages >&2; then
  apt-get update >&2
  apt-get install -y --no-install-recommends $packages >&2
fi
if ! command -v protoc >/dev/null 2>&1; then
  echo "build-deps.sh: error: still missing protoc after installing $packages" >&2
  exit 1
fi
