#!/usr/bin/env bash
# Builds podstamp-kubecheck, podstamp's pod check (the kubelet's own decision
# on a static pod file; see cmd/podstamp-kubecheck/main.go), from this
# directory's go.mod: the Kubernetes release it speaks for is the one pinned
# here, whose kubelet the tests run.
#
# Writes ${PODSTAMP_KUBECHECK_OUT:-<target>/kubecheck}/podstamp-kubecheck,
# where <target> is $CARGO_TARGET_DIR or <repo>/target: podstamp looks for it
# there when run from a build tree (beside the binary, then a `kubecheck/`
# directory up to three levels above it; PODSTAMP_KUBECHECK names it).
#
# Reproducible: a static binary (CGO_ENABLED=0), -trimpath, no VCS stamp,
# modules from go.sum only. Uses the default Go build cache, so an unchanged
# rebuild takes a few seconds (and the harness's own build shares the
# compiled Kubernetes packages).
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$HARNESS_DIR/../.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_DIR/target}"
OUT_DIR="${PODSTAMP_KUBECHECK_OUT:-$TARGET_DIR/kubecheck}"

# shellcheck source=go-env.sh
source "$HARNESS_DIR/go-env.sh" build-kubecheck.sh
export CGO_ENABLED=0

mkdir -p "$OUT_DIR"
cd "$HARNESS_DIR"
"$GO" build -buildvcs=false -trimpath -ldflags="-s -w" -o "$OUT_DIR/podstamp-kubecheck" ./cmd/podstamp-kubecheck
echo "build-kubecheck.sh: built $OUT_DIR/podstamp-kubecheck ($("$OUT_DIR/podstamp-kubecheck" --version))" >&2
