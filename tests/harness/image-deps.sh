#!/usr/bin/env bash
# Makes sure the host can build and push podstamp's container image
# (deploy/image/build.sh, deploy/image/push.sh, tests/image.rs): Debian's
# `buildah` (builds the image without a container engine daemon), `skopeo`
# (copies it to a registry), and binutils' `objcopy` (strips the binary).
# Installs the packages with apt-get when they are missing and this runs as
# root, unless PODSTAMP_NO_INSTALL=1; otherwise fails in one line saying how
# to install them.
set -euo pipefail

packages="buildah skopeo binutils"
hint="install them with: sudo apt-get install -y $packages"

missing() {
  local out=()
  for tool in buildah skopeo objcopy; do
    command -v "$tool" >/dev/null 2>&1 || out+=("$tool")
  done
  echo "${out[*]}"
}

gone="$(missing)"
[[ -z "$gone" ]] && exit 0
if [[ "${PODSTAMP_NO_INSTALL:-}" == 1 || "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "image-deps.sh: error: missing $gone; $hint" >&2
  exit 1
fi
echo "image-deps.sh: missing $gone: installing the Debian packages $packages" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends $packages >&2; then
  apt-get update >&2
  apt-get install -y --no-install-recommends $packages >&2
fi
gone="$(missing)"
if [[ -n "$gone" ]]; then
  echo "image-deps.sh: error: still missing $gone after installing $packages" >&2
  exit 1
fi
