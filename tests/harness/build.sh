#!/usr/bin/env bash
# Builds the podstamp e2e test harness binaries (see tests/harness/README.md):
#   podstamp-apiserver      embedded etcd + real kube-apiserver
#   podstamp-manifestcheck  the kubelet's static pod file decoder
#   kubelet                 the real kubelet, same pinned release (a `tool`
#                           in go.mod keeps its dependencies in go.sum)
#   podstamp-node           brings up containerd + kubelet for one test node
# into ${PODSTAMP_HARNESS_BIN:-<repo>/target/harness}.
# Uses the default GOPATH/GOCACHE, so a rebuild with unchanged sources is quick.
set -euo pipefail

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$HARNESS_DIR/../.." && pwd)"
BIN_DIR="${PODSTAMP_HARNESS_BIN:-$REPO_DIR/target/harness}"

# shellcheck source=go-env.sh
source "$HARNESS_DIR/go-env.sh" build.sh

mkdir -p "$BIN_DIR"
cd "$HARNESS_DIR"

echo "build.sh: $("$GO" version) -> $BIN_DIR" >&2
# Stamp the Kubernetes version like the official release build does
# (hack/lib/version.sh), so /version reports e.g. v1.37.2 instead of v0.0.0-master.
KUBE_VERSION="$("$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
KUBE_MAJOR="${KUBE_VERSION#v}"; KUBE_MAJOR="${KUBE_MAJOR%%.*}"
KUBE_MINOR="${KUBE_VERSION#v*.}"; KUBE_MINOR="${KUBE_MINOR%%.*}"
# Stripped unless PODSTAMP_HARNESS_SYMBOLS=1: a profile of the API server
# (perf record) needs its symbols; build those into a directory of their
# own (PODSTAMP_HARNESS_BIN) and point the run at it with the same variable.
LDFLAGS="-s -w"
if [[ "${PODSTAMP_HARNESS_SYMBOLS:-0}" == 1 ]]; then
  LDFLAGS=""
fi
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$KUBE_MAJOR -X $pkg.gitMinor=$KUBE_MINOR -X $pkg.gitTreeState=clean"
done

# go build fetches missing modules through the module proxy (GOPROXY) itself.
"$GO" build -buildvcs=false -trimpath -ldflags="$LDFLAGS" -o "$BIN_DIR/" ./cmd/podstamp-apiserver ./cmd/podstamp-manifestcheck \
  ./cmd/podstamp-node k8s.io/kubernetes/cmd/kubelet
echo "build.sh: built $BIN_DIR/podstamp-apiserver $BIN_DIR/podstamp-manifestcheck $BIN_DIR/podstamp-node $BIN_DIR/kubelet" >&2
