#!/usr/bin/env bash
# Renders the bundled example offline: the pod-checkpointer PodTemplate for
# the example Node, through the example plugin chain, printed to stdout.
# Builds (and if needed installs the toolchain for) the plugins first, and
# podstamp's pod check (the kubelet's own validation, a Go program: Go >= 1.26
# must be installed; a minute or two the first time).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash plugins/build.sh >&2
bash tests/harness/build-kubecheck.sh >&2
# protoc, for the CRI bindings the build generates.
bash tests/harness/build-deps.sh >&2
cargo build --release --quiet --bin podstamp
exec target/release/podstamp render examples/pod-checkpointer.yaml \
  --node examples/node.yaml --config examples/podstamp.yaml "$@"
