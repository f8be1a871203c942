#!/usr/bin/env bash
# Builds every plugin under plugins/ (each crate with crate-type cdylib) into a
# WebAssembly component: ${PODSTAMP_PLUGIN_DIR:-<repo>/target/plugins}/<name>.wasm
#
# Usage: bash plugins/build.sh          (from anywhere)
#        PODSTAMP_PLUGIN_PROFILE=quick bash plugins/build.sh
#          (no LTO: twice the size, but relinks a plugin in seconds)
#
# What it needs, and installs when missing:
#   - Debian's rustc-web, cargo-web, rust-web-src and lld-16 (a rustc >= 1.95
#     with its std sources, to build std for wasm32-unknown-unknown with
#     -Zbuild-std, and the wasm linker); installing them needs root.
#   - wasm-tools 1.263.0, installed with rustup's cargo.
# Up to date components are not rebuilt. Every component is validated and
# must import nothing but the podstamp host interface.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
out_dir="${PODSTAMP_PLUGIN_DIR:-$repo/target/plugins}"
target_dir="$repo/target/wasm32"
target=wasm32-unknown-unknown
profile="${PODSTAMP_PLUGIN_PROFILE:-release}"
wasm_tools_version=1.263.0
allowed_imports=("podstamp:plugin/host@0.1.0" "podstamp:plugin/types@0.1.0")
required_export="podstamp:plugin/transformer@0.1.0"

say() { echo "build.sh: $*" >&2; }
die() {
    say "error: $*"
    exit 1
}

# --- toolchain: /usr/bin/rustc that can build std for wasm32 ---------------
toolchain_ok() {
    [[ -x /usr/bin/rustc && -x /usr/bin/cargo ]] || return 1
    command -v wasm-ld-16 >/dev/null || return 1
    local version sysroot
    version="$(/usr/bin/rustc --version)" || return 1
    # rustc 1.96.0 (...) -> 1.96; the workspace needs edition 2024 and 1.95.
    [[ "$version" =~ ^rustc\ 1\.([0-9]+)\. ]] && ((BASH_REMATCH[1] >= 95)) || return 1
    sysroot="$(/usr/bin/rustc --print sysroot)" || return 1
    [[ -f "$sysroot/lib/rustlib/src/rust/library/std/Cargo.toml" ]] || return 1
    /usr/bin/rustc --print target-cpus --target "$target" >/dev/null 2>&1 || return 1
}

if ! toolchain_ok; then
    packages=(rustc-web cargo-web rust-web-src lld-16)
    say "/usr/bin/rustc cannot build for $target (needs rustc >= 1.95, rust-src, wasm-ld-16)"
    if [[ "$(id -u)" != 0 ]]; then
        die "run as root, or install them first: apt-get update && apt-get install -y ${packages[*]}"
    fi
    say "installing ${packages[*]} with apt-get"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${packages[@]}" >&2
    toolchain_ok || die "still no usable /usr/bin/rustc for $target after installing ${packages[*]}"
fi

# --- wasm-tools --------------------------------------------------------------
wasm_tools="$(command -v wasm-tools || true)"
if [[ -z "$wasm_tools" && -x "${CARGO_HOME:-$HOME/.cargo}/bin/wasm-tools" ]]; then
    wasm_tools="${CARGO_HOME:-$HOME/.cargo}/bin/wasm-tools"
fi
if [[ -z "$wasm_tools" ]]; then
    rustup_cargo="${CARGO_HOME:-$HOME/.cargo}/bin/cargo"
    [[ -x "$rustup_cargo" ]] || rustup_cargo="$(command -v cargo || true)"
    [[ -n "$rustup_cargo" ]] || die "wasm-tools is missing and there is no cargo to install it"
    say "installing wasm-tools $wasm_tools_version with $rustup_cargo (takes a few minutes)"
    "$rustup_cargo" install wasm-tools --version "$wasm_tools_version" --locked >&2
    wasm_tools="${CARGO_HOME:-$HOME/.cargo}/bin/wasm-tools"
    [[ -x "$wasm_tools" ]] || die "cargo install wasm-tools did not produce $wasm_tools"
fi

# --- the plugins ---------------------------------------------------------------
plugins=()
for manifest in "$here"/*/Cargo.toml; do
    if grep -Eq '^crate-type *= *\[ *"cdylib" *\]' "$manifest"; then
        plugins+=("$(basename "$(dirname "$manifest")")")
    fi
done
((${#plugins[@]} > 0)) || die "no plugin crates (crate-type = [\"cdylib\"]) under $here"

package_args=()
for name in "${plugins[@]}"; do package_args+=(-p "$name"); done

say "building ${plugins[*]} for $target ($profile profile)"
# A clean environment: only Debian's toolchain on PATH (not rustup's proxies),
# and nothing inherited from an outer cargo (RUSTFLAGS, jobserver, wrappers).
clean_env=(env -i "HOME=$HOME" "PATH=/usr/bin:/bin" "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}")
for var in TERM CARGO_NET_OFFLINE CARGO_BUILD_JOBS CARGO_TERM_COLOR http_proxy https_proxy; do
    if [[ -n "${!var:-}" ]]; then clean_env+=("$var=${!var}"); fi
done
"${clean_env[@]}" \
    RUSTC=/usr/bin/rustc \
    RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-16 \
    CARGO_TARGET_DIR="$target_dir" \
    /usr/bin/cargo build --manifest-path "$here/Cargo.toml" --profile "$profile" \
    --target "$target" -Zbuild-std=std,panic_abort "${package_args[@]}"

# --- core modules -> components, checked ---------------------------------------
mkdir -p "$out_dir"
trap 'rm -f "$out_dir"/*.wasm.tmp.$$' EXIT

check_component() {
    local file="$1" wit imports line
    "$wasm_tools" validate "$file" || die "$file is not a valid component"
    wit="$("$wasm_tools" component wit "$file")" || die "cannot read the WIT of $file"
    # The lines of the component's own world (the first one printed).
    imports="$(awk '/^world /{w=1; next} w && /^}/{exit} w' <<<"$wit" | sed -n 's/^ *import \(.*\);$/\1/p')"
    while IFS= read -r line; do
        [[ -z "$line" ]] && continue
        local ok=0 allowed
        for allowed in "${allowed_imports[@]}"; do [[ "$line" == "$allowed" ]] && ok=1; done
        ((ok)) || die "$file imports $line: a plugin may import only ${allowed_imports[*]}"
    done <<<"$imports"
    awk '/^world /{w=1; next} w && /^}/{exit} w' <<<"$wit" | grep -qx "  export $required_export;" ||
        die "$file does not export $required_export"
}

for name in "${plugins[@]}"; do
    core="$target_dir/$target/$profile/${name//-/_}.wasm"
    component="$out_dir/$name.wasm"
    # Which core module the component was made from, so that switching
    # profiles remakes it even when the other profile's module is older.
    stamp="$out_dir/.$name.wasm.from"
    [[ -f "$core" ]] || die "cargo did not produce $core"
    if [[ ! "$component" -nt "$core" || "$(cat "$stamp" 2>/dev/null)" != "$core" ]]; then
        tmp="$component.tmp.$$"
        "$wasm_tools" component new "$core" -o "$tmp" || die "wasm-tools component new failed for $core"
        check_component "$tmp"
        mv -f "$tmp" "$component"
        echo "$core" >"$stamp"
    else
        check_component "$component"
    fi
done

say "components in $out_dir:"
for name in "${plugins[@]}"; do
    component="$out_dir/$name.wasm"
    printf '  %-40s %8d bytes\n' "$component" "$(stat -c %s "$component")"
done
