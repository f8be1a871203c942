#!/usr/bin/env bash
# Builds JavaScript podstamp plugins into WebAssembly components.
#
# Usage: bash plugins/js/build.sh
#          every plugin directory under plugins/js/ (one with a package.json,
#          but the SDK and the toolchain) -> ${PODSTAMP_PLUGIN_DIR:-<repo>/target/plugins}/<name>.wasm,
#          <name> being the package.json's name
#        bash plugins/js/build.sh PLUGIN_DIR OUT.wasm
#          one plugin, anywhere (what a scaffolded plugin's build runs)
#
# What it needs: node >= 20.19 and npm, and python3 for a plugin that declares
# its scope (plugins/scope-section.py writes it). It installs the toolchain pinned in
# plugins/js/toolchain/package-lock.json (componentize-js, rolldown, jco)
# with `npm ci`, once, into ${PODSTAMP_JS_TOOLCHAIN:-~/.cache/podstamp-js/<lock hash>}
# (about 400 MB, shared by every checkout with the same lock file).
# Up to date components are not rebuilt (newer than the plugin's files, the
# SDK, the WIT and the lock file). Each component is checked by build.mjs:
# it must import nothing but the podstamp host and the WASI interfaces the
# host grants, and export the transformer.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
lock="$here/toolchain/package-lock.json"

say() { echo "js/build.sh: $*" >&2; }
die() {
    say "error: $*"
    exit 1
}

# --- the toolchain ---------------------------------------------------------------
command -v node >/dev/null && command -v npm >/dev/null ||
    die "node and npm are missing: install Node.js >= 20.19 (e.g. apt-get install -y nodejs npm)"
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)' ||
    die "node $(node --version) is too old: rolldown needs >= 20.19"

lock_hash="$(sha256sum "$lock" | cut -c1-16)"
toolchain="${PODSTAMP_JS_TOOLCHAIN:-${XDG_CACHE_HOME:-$HOME/.cache}/podstamp-js/$lock_hash}"
if [[ ! -f "$toolchain/.installed" ]]; then
    say "installing the JavaScript toolchain (componentize-js) into $toolchain (about a minute, once)"
    mkdir -p "$(dirname "$toolchain")"
    staging="$(mktemp -d "$toolchain.tmp.XXXXXX")"
    cp "$here/toolchain/package.json" "$lock" "$staging/"
    if ! (cd "$staging" && npm ci --no-audit --no-fund --loglevel=error >&2); then
        rm -rf "$staging"
        die "npm ci failed; install by hand: mkdir -p $toolchain && cp $here/toolchain/package*.json $toolchain/ && (cd $toolchain && npm ci) && touch $toolchain/.installed"
    fi
    touch "$staging/.installed"
    # Another build may have installed it meanwhile: keep the first.
    mv -T "$staging" "$toolchain" 2>/dev/null || rm -rf "$staging"
fi
export PODSTAMP_JS_TOOLCHAIN="$toolchain"

# --- the plugins ---------------------------------------------------------------------
# Whether $2 is missing or older than any file $1's build reads.
stale() {
    local dir="$1" out="$2"
    [[ -f "$out" ]] || return 0
    [[ -n "$(find "$dir" "$here/podstamp-plugin" "$here/build.mjs" "$repo/wit" "$lock" "$repo/plugins/scope-section.py" \
        "$repo/host/src/plugin/wasi.rs" -path "$dir/node_modules" -prune -o \
        -type f -newer "$out" -print -quit)" ]]
}

build() {
    local dir="$1" out="$2"
    if stale "$dir" "$out"; then
        mkdir -p "$(dirname "$out")"
        node "$here/build.mjs" "$dir" "$out"
    else
        say "$(basename "$out") is up to date"
    fi
}

if (($# == 2)); then
    [[ -f "$1/package.json" ]] || die "$1 has no package.json: not a plugin directory"
    mkdir -p "$(dirname "$2")"
    build "$(cd "$1" && pwd)" "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
    exit 0
fi
(($# == 0)) || die "usage: bash plugins/js/build.sh [PLUGIN_DIR OUT.wasm]"

out_dir="${PODSTAMP_PLUGIN_DIR:-$repo/target/plugins}"
for pkg in "$here"/*/package.json; do
    dir="$(dirname "$pkg")"
    case "$(basename "$dir")" in podstamp-plugin | toolchain) continue ;; esac
    name="$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).name)' "$pkg")"
    build "$dir" "$out_dir/$name.wasm"
done
