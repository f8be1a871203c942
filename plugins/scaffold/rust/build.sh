#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm with podstamp's own plugin
# build ({{plugins}}/build.sh: Debian's wasm toolchain, installed on first
# use; std rebuilt for wasm32; nothing redone when up to date).
# PODSTAMP_PLUGIN_PROFILE=quick skips LTO while iterating.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "{{plugins}}/build.sh" --manifest-path "$here/Cargo.toml" --out-dir "$here/target"
