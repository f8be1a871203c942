#!/usr/bin/env bash
# Builds kustomize's own command (sigs.k8s.io/kustomize/kustomize/v5, a
# pinned release, from the Go module proxy) into
# ${PODSTAMP_HARNESS_BIN:-<repo>/target/harness}/kustomize, for
# tests/kustomize.rs: `kustomize edit set image`, the command
# deploy/image/push.sh prints, which kubectl's built-in kustomize lacks
# (`kubectl kustomize` only builds). Quick when already built.
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN_DIR="${PODSTAMP_HARNESS_BIN:-$REPO_DIR/target/harness}"
# The newest release whose modules build with Go 1.26 (5.8 needs a newer Go).
VERSION=v5.7.1

# shellcheck source=go-env.sh
source "$HARNESS_DIR/go-env.sh" build-kustomize.sh

if [[ -x "$BIN_DIR/kustomize" ]] && "$BIN_DIR/kustomize" version 2>/dev/null | grep -qx "${VERSION}"; then
  exit 0
fi
mkdir -p "$BIN_DIR"
# `go install module@version` resolves the module's own go.mod, not the
# harness's; -mod=readonly (go-env.sh) does not apply to it.
GOFLAGS= GOBIN="$BIN_DIR" "$GO" install -trimpath \
  -ldflags="-s -w" \
  "sigs.k8s.io/kustomize/kustomize/v5@$VERSION"
echo "build-kustomize.sh: built $BIN_DIR/kustomize ($VERSION)" >&2
