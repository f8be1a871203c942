# Sourced by the harness's build scripts: finds the Go toolchain ($GO) and
# sets the environment every build of this module uses. $1 names the script
# in the error line.
#
# Never switch toolchains behind our back: the module needs go >= 1.26.0 and
# must build with the installed one. Reproducible module resolution:
# go.mod/go.sum are authoritative.
GO="${GO:-}"
if [[ -z "$GO" ]]; then
  if command -v go >/dev/null 2>&1; then
    GO="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
  else
    echo "$1: error: 'go' not found (need Go >= 1.26 on PATH, or at /usr/local/go/bin/go, or set GO=/path/to/go)" >&2
    exit 1
  fi
fi
export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
