#!/usr/bin/env bash
# Makes sure the host can check and unit-test podstamp's alerting rules
# (tests/monitoring.rs): `promtool`, from Debian's `prometheus` package.
# Installs it with apt-get when it is missing and this runs as root, unless
# PODSTAMP_NO_INSTALL=1; otherwise fails in one line saying how to install
# it.
set -euo pipefail

# shellcheck source=tests/harness/debian-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"

# Only promtool is used: the package's own Prometheus service is never started.
need_debian_packages monitoring-deps.sh prometheus \
  "install it with: sudo apt-get install prometheus" \
  promtool
