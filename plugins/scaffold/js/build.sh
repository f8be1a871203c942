#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm with podstamp's JavaScript
# build (componentize-js, installed on first use; see
# {{plugins}}/js/README.md). Up to date output is not rebuilt.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "{{plugins}}/js/build.sh" "$here" "$here/target/{{name}}.wasm"
