#!/usr/bin/env bash
# The whole test suite, from a fresh clone: builds the plugins and the Go
# harness (API server, kubelet, test node; installing their toolchains when
# missing), installs protoc (the host build's CRI bindings), the node's
# Debian packages (containerd, runc, busybox-static), the test registry's, the image build's (buildah,
# skopeo) and promtool (Debian's prometheus) when missing, then runs every
# test. The README and .ci/run both use this command.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

step() { printf '\n==> %s\n' "$*" >&2; }

step "the host build's packages: protoc, for the CRI bindings (tests/harness/build-deps.sh)"
bash tests/harness/build-deps.sh

step "building the example plugins (plugins/build.sh)"
bash plugins/build.sh

step "building the Python example plugins (plugins/python/build.sh: componentize-py from PyPI)"
bash plugins/python/build.sh

step "building the JavaScript example plugins (plugins/js/build.sh; installs componentize-js from npm once)"
bash plugins/js/build.sh

step "building the Go harness: API server, kubelet, test node (tests/harness/build.sh)"
bash tests/harness/build.sh

step "building podstamp's pod check: the kubelet's own validation (tests/harness/build-kubecheck.sh)"
bash tests/harness/build-kubecheck.sh

step "kustomize's own command, for \`kustomize edit\` (tests/harness/build-kustomize.sh)"
bash tests/harness/build-kustomize.sh

step "the test node's host packages (tests/harness/node-deps.sh)"
bash tests/harness/node-deps.sh

step "the test registry's host packages (tests/harness/registry-deps.sh)"
bash tests/harness/registry-deps.sh

step "the image build's host packages: buildah, skopeo (tests/harness/image-deps.sh)"
bash tests/harness/image-deps.sh

step "the alerting rules' checker: promtool (tests/harness/monitoring-deps.sh)"
bash tests/harness/monitoring-deps.sh

step "host tests (cargo test --workspace)"
cargo test --workspace --locked

step "fuzzing, bounded: more proptest cases (tests/fuzz.rs; about a minute: every rendered pod also gets the kubelet's verdict)"
PROPTEST_CASES="${PROPTEST_CASES:-50000}" cargo test -p podstamp --locked --test fuzz

step "plugin unit tests, native (cargo test --manifest-path plugins/Cargo.toml)"
cargo test --manifest-path plugins/Cargo.toml --locked

step "Python SDK and example unit tests, native (plugins/python/tests)"
python3 -m unittest discover -s plugins/python/tests
