#!/usr/bin/env bash
# Makes sure the host can run the test registry (tests/oci.rs): Debian's
# `docker-registry` (the CNCF distribution registry) and `htpasswd` (from
# apache2-utils, for the bcrypt password file the registry's basic auth
# reads). Installs the packages with apt-get when they are missing and this
# runs as root, unless PODSTAMP_NO_INSTALL=1; otherwise fails in one line
# saying how to install them.
set -euo pipefail

packages="docker-registry apache2-utils"
hint="install them with: sudo apt-get install $packages"

missing() {
  local out=()
  for tool in docker-registry htpasswd; do
    command -v "$tool" >/dev/null 2>&1 || out+=("$tool")
  done
  echo "${out[*]}"
}

gone="$(missing)"
[[ -z "$gone" ]] && exit 0
if [[ "${PODSTAMP_NO_INSTALL:-}" == 1 || "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "registry-deps.sh: error: missing $gone; $hint" >&2
  exit 1
fi
echo "registry-deps.sh: missing $gone: installing the Debian packages $packages" >&2
export DEBIAN_FRONTEND=noninteractive
# The package's own service is not wanted: the tests start their registry.
if ! apt-get install -y --no-install-recommends $packages >&2; then
  apt-get update >&2
  apt-get install -y --no-install-recommends $packages >&2
fi
gone="$(missing)"
if [[ -n "$gone" ]]; then
  echo "registry-deps.sh: error: still missing $gone after installing $packages" >&2
  exit 1
fi
