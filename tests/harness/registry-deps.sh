#!/usr/bin/env bash
# Makes sure the host can run the test registry (tests/oci.rs): Debian's
# `docker-registry` (the CNCF distribution registry) and `htpasswd` (from
# apache2-utils, for the bcrypt password file the registry's basic auth
# reads). Installs the packages with apt-get when they are missing and this
# runs as root, unless PODSTAMP_NO_INSTALL=1; otherwise fails in one line
# saying how to install them.
set -euo pipefail

# shellcheck source=tests/harness/debian-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"

# The package's own service is not wanted: the tests start their registry.
need_debian_packages registry-deps.sh "docker-registry apache2-utils" \
  "install them with: sudo apt-get install docker-registry apache2-utils" \
  docker-registry htpasswd
