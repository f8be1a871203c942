#!/usr/bin/env bash
# Builds Python plugins into WebAssembly components with componentize-py.
#
# Usage: bash plugins/python/build.sh
#          every example here (plugins/python/<name>/app.py) ->
#          ${PODSTAMP_PLUGIN_DIR:-<repo>/target/plugins}/<name>.wasm
#        bash plugins/python/build.sh SRC_DIR OUT.wasm
#          one plugin: the module app.py in SRC_DIR (an out-of-tree plugin,
#          e.g. one made by `podstamp plugin new NAME --lang python`)
#
# What it needs, and installs when missing:
#   - componentize-py 0.25.1 from PyPI, in a venv under
#     ${PODSTAMP_PYTHON_TOOLS:-~/.cache/podstamp}/componentize-py-0.25.1
#     (needs python3 with venv and pip); or set PODSTAMP_COMPONENTIZE_PY to
#     a componentize-py of that version;
#   - wasm-tools (the version plugins/build.sh pins), installed with cargo;
#   - python3, which runs plugins/scope-section.py: it writes the scope the
#     plugin declares (app.py's module-level PODSTAMP_SCOPE, a list of
#     grants) into the component, as the Rust SDK's scope! does.
# An up-to-date component (newer than its sources, the SDK, the WIT and
# this script) is not rebuilt. Every component is validated and must import
# nothing but the podstamp host interface and the WASI 0.2 interfaces the
# host grants (the list in host/src/plugin/wasi.rs).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version=0.25.1
tools="${PODSTAMP_PYTHON_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/podstamp}"
venv="$tools/componentize-py-$version"
wit="$repo/wit"
required_exports=("podstamp:plugin/transformer@0.1.1" "podstamp:plugin/settings-validator@0.1.1")

say() { echo "python/build.sh: $*" >&2; }
die() {
    say "error: $*"
    exit 1
}

# --- componentize-py -----------------------------------------------------------
componentize_py="${PODSTAMP_COMPONENTIZE_PY:-$venv/bin/componentize-py}"
has_version() { [[ -x "$1" ]] && [[ "$("$1" --version 2>/dev/null)" == *" $version"* ]]; }
if ! has_version "$componentize_py"; then
    [[ -z "${PODSTAMP_COMPONENTIZE_PY:-}" ]] ||
        die "PODSTAMP_COMPONENTIZE_PY=$PODSTAMP_COMPONENTIZE_PY is not componentize-py $version"
    by_hand="install it by hand: python3 -m venv $venv && $venv/bin/pip install componentize-py==$version (or set PODSTAMP_COMPONENTIZE_PY)"
    say "installing componentize-py $version from PyPI into $venv"
    rm -rf "$venv"
    mkdir -p "$tools"
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$version"; } >&2; then
        rm -rf "$venv"
        die "could not install componentize-py $version; $by_hand"
    fi
    has_version "$componentize_py" || die "componentize-py $version did not install as $componentize_py; $by_hand"
fi

# --- wasm-tools, as plugins/build.sh installs it ---------------------------------
wasm_tools_version="$(sed -n 's/^wasm_tools_version=//p' "$repo/plugins/build.sh")"
wasm_tools="$(command -v wasm-tools || true)"
if [[ -z "$wasm_tools" && -x "${CARGO_HOME:-$HOME/.cargo}/bin/wasm-tools" ]]; then
    wasm_tools="${CARGO_HOME:-$HOME/.cargo}/bin/wasm-tools"
fi
if [[ -z "$wasm_tools" ]]; then
    say "installing wasm-tools $wasm_tools_version with cargo (takes a few minutes)"
    cargo install wasm-tools --version "$wasm_tools_version" --locked >&2 ||
        die "could not install wasm-tools; install it by hand: cargo install wasm-tools --version $wasm_tools_version --locked"
    wasm_tools="${CARGO_HOME:-$HOME/.cargo}/bin/wasm-tools"
fi

# --- what a component may import -------------------------------------------------
# The host's list, read from its source so that the two cannot drift apart.
mapfile -t wasi_interfaces < <(
    sed -n '/^pub(super) const WASI_INTERFACES/,/^];/p' "$repo/host/src/plugin/wasi.rs" |
        grep -o '"wasi:[^"]*"' | tr -d '"'
)
((${#wasi_interfaces[@]} > 0)) || die "cannot read WASI_INTERFACES from host/src/plugin/wasi.rs"

check_component() {
    local file="$1" world line iface
    "$wasm_tools" validate "$file" || die "$file is not a valid component"
    # The component's own world: the first one `component wit` prints.
    world="$("$wasm_tools" component wit "$file" | awk '/^world /{w=1; next} w && /^}/{exit} w')" ||
        die "cannot read the WIT of $file"
    while IFS= read -r line; do
        [[ -z "$line" ]] && continue
        case "$line" in
        podstamp:plugin/host@0.1.1 | podstamp:plugin/types@0.1.1) continue ;;
        wasi:*@0.2.*)
            iface="${line%@*}"
            local granted
            for granted in "${wasi_interfaces[@]}"; do [[ "$iface" == "$granted" ]] && continue 2; done
            ;;
        esac
        die "$file imports $line, which podstamp does not provide (it grants podstamp:plugin/host and: ${wasi_interfaces[*]})"
    done < <(sed -n 's/^ *import \(.*\);$/\1/p' <<<"$world")
    local export
    for export in "${required_exports[@]}"; do
        grep -qx "  export $export;" <<<"$world" || die "$file does not export $export"
    done
}

# --- the scope a plugin declares ---------------------------------------------------
scope_tool="$repo/plugins/scope-section.py"
command -v python3 >/dev/null || die "python3 is missing (it writes the declared scope): install it, e.g. apt-get install -y python3"

# --- build --------------------------------------------------------------------------
build_one() {
    local src="$1" out="$2" tmp
    src="$(cd "$src" && pwd)"
    [[ -f "$src/app.py" ]] || die "$src has no app.py (the plugin's module)"
    mkdir -p "$(dirname "$out")"
    out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
    # Up to date: nothing it is made from is newer.
    if [[ -f "$out" ]] && [[ -z "$(find "$src" "$here/podstamp_plugin" "$wit" "$here/build.sh" "$scope_tool" \
        -name '*.py' -newer "$out" -o -name '*.wit' -newer "$out" -o -name build.sh -newer "$out" | head -1)" ]]; then
        check_component "$out"
        return
    fi
    # It says what is wrong itself, in one line.
    python3 "$scope_tool" --check-python "$src/app.py" || exit 1
    say "building $out from $src/app.py"
    tmp="$out.tmp.$$"
    trap 'rm -f "$tmp"' RETURN
    (cd "$src" && "$componentize_py" -d "$wit" -w plugin componentize \
        -p "$here" -p "$src" app -o "$tmp" >&2) || die "componentize-py failed for $src/app.py"
    # componentize-py cannot write a custom section: the declared scope is
    # added to the component it made (nothing, if app.py declares none).
    python3 "$scope_tool" "$tmp" --from-python "$src/app.py" || exit 1
    check_component "$tmp"
    mv -f "$tmp" "$out"
}

if (($# == 2)); then
    build_one "$1" "$2"
    printf '  %-40s %8d bytes\n' "$2" "$(stat -c %s "$2")" >&2
elif (($# == 0)); then
    out_dir="${PODSTAMP_PLUGIN_DIR:-$repo/target/plugins}"
    for app in "$here"/*/app.py; do
        name="$(basename "$(dirname "$app")")"
        build_one "$(dirname "$app")" "$out_dir/$name.wasm"
        printf '  %-40s %8d bytes\n' "$out_dir/$name.wasm" "$(stat -c %s "$out_dir/$name.wasm")" >&2
    done
else
    die "usage: build.sh [SRC_DIR OUT.wasm]"
fi
