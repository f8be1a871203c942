# Sourced by the *-deps.sh scripts: one way to make sure a host has the
# Debian packages a part of the suite needs. A missing tool is installed
# with apt-get when this runs as root and PODSTAMP_NO_INSTALL is not 1;
# otherwise the script fails in one line naming what is missing and how to
# install it. Never installs what is already there, so a prepared host
# (CI's cache, a developer's machine) runs no apt-get at all.
#
# need_debian_packages SCRIPT "PACKAGES" "HINT" TOOL...
#   SCRIPT    the caller's name, the prefix of every line it prints
#   PACKAGES  the Debian packages that provide the tools
#   HINT      how a user installs them by hand
#   TOOL      a command looked up on PATH, or an absolute path that must be
#             executable

missing_tools() {
  local out=() tool
  for tool in "$@"; do
    if [[ "$tool" == /* ]]; then
      [[ -x "$tool" ]] || out+=("$tool")
    else
      command -v "$tool" >/dev/null 2>&1 || out+=("$tool")
    fi
  done
  echo "${out[*]}"
}

need_debian_packages() {
  local script="$1" packages="$2" hint="$3"
  shift 3
  local gone
  gone="$(missing_tools "$@")"
  [[ -z "$gone" ]] && return 0
  if [[ "${PODSTAMP_NO_INSTALL:-}" == 1 || "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$script: error: missing $gone; $hint" >&2
    return 1
  fi
  echo "$script: missing $gone: installing the Debian packages $packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Packages that ship a service (docker-registry, prometheus) do not start
  # it here: there is no init system, and the tests start their own servers.
  # shellcheck disable=SC2086 # a list of package names
  if ! apt-get install -y --no-install-recommends $packages >&2; then
    apt-get update >&2
    # shellcheck disable=SC2086
    apt-get install -y --no-install-recommends $packages >&2
  fi
  gone="$(missing_tools "$@")"
  if [[ -n "$gone" ]]; then
    echo "$script: error: still missing $gone after installing $packages" >&2
    return 1
  fi
}
