#!/usr/bin/env bash
# Makes sure the host can check and unit-test podstamp's alerting rules
# (tests/monitoring.rs): `promtool`, from Debian's `prometheus` package.
# Installs it with apt-get when it is missing and this runs as root, unless
# PODSTAMP_NO_INSTALL=1; otherwise fails in one line saying how to install
# it.
set -euo pipefail

packages="prometheus"
hint="install it with: sudo apt-get install prometheus"

command -v promtool >/dev/null 2>&1 && exit 0
if [[ "${PODSTAMP_NO_INSTALL:-}" == 1 || "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "monitoring-deps.sh: error: missing promtool; $hint" >&2
  exit 1
fi
echo "monitoring-deps.sh: missing promtool: installing the Debian package $packages" >&2
export DEBIAN_FRONTEND=noninteractive
# Only promtool is used: the package's own Prometheus service is not wanted
# (without an init system it is not started; it is never started here).
if ! apt-get install -y --no-install-recommends $packages >&2; then
  apt-get update >&2
  apt-get install -y --no-install-recommends $packages >&2
fi
if ! command -v promtool >/dev/null 2>&1; then
  echo "monitoring-deps.sh: error: still missing promtool after installing $packages" >&2
  exit 1
fi
