#!/usr/bin/env bash
# Makes sure the host can build and push podstamp's container image
# (deploy/image/build.sh, deploy/image/push.sh, tests/image.rs): Debian's
# `buildah` (builds the image without a container engine daemon), `skopeo`
# (copies it to a registry), and binutils' `objcopy` (strips the binary).
# Installs the packages with apt-get when they are missing and this runs as
# root, unless PODSTAMP_NO_INSTALL=1; otherwise fails in one line saying how
# to install them.
set -euo pipefail

# shellcheck source=tests/harness/debian-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"

need_debian_packages image-deps.sh "buildah skopeo binutils" \
  "install them with: sudo apt-get install -y buildah skopeo binutils" \
  buildah skopeo objcopy
