#!/usr/bin/env bash
# Builds this plugin into target/{{name}}.wasm with podstamp's Python build
# (componentize-py, installed on first use; nothing redone when up to date).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "{{plugins}}/python/build.sh" "$here" "$here/target/{{name}}.wasm"
