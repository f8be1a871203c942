#!/usr/bin/env bash
# Builds every plugin under plugins/ (each crate with crate-type cdylib) into a
# WebAssembly component: ${PODSTAMP_PLUGIN_DIR:-<repo>/target/plugins}/<name>.wasm
#
# Usage: bash plugins/build.sh          (from anywhere)
#        PODSTAMP_PLUGIN_PROFILE=quick bash plugins/build.sh
#          (no LTO: twice the size, but relinks a plugin in seconds)
#        bash plugins/build.sh --manifest-path DIR/Cargo.toml [--out-dir OUT] [--target-dir T]
#          one plugin crate anywhere, e.g. one made by `podstamp plugin new`
#          (its own Cargo workspace, depending on plugins/podstamp-plugin):
#          -> OUT/<package>.wasm (default DIR/target), built in T (default
#          DIR/target/wasm32, or $PODSTAMP_PLUGIN_TARGET_DIR).
#
# The build profile (panic=abort, size-optimised, LTO; `quick` without LTO)
# is set here for every crate built, so that a plugin made outside this tree
# is built exactly as the examples are.
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
manifest=""
out_dir=""
target_dir="${PODSTAMP_PLUGIN_TARGET_DIR:-}"
while (($#)); do
    case "$1" in
    --manifest-path | --out-dir | --target-dir)
        (($# >= 2)) || { echo "build.sh: error: $1 needs a value" >&2; exit 2; }
        case "$1" in
        --manifest-path) manifest="$2" ;;
        --out-dir) out_dir="$2" ;;
        --target-dir) target_dir="$2" ;;
        esac
        shift 2
        ;;
    *)
        echo "build.sh: error: unknown argument $1 (usage: build.sh [--manifest-path Cargo.toml] [--out-dir DIR] [--target-dir DIR])" >&2
        exit 2
        ;;
    esac
done
if [[ -n "$manifest" ]]; then
    [[ -f "$manifest" ]] || { echo "build.sh: error: --manifest-path $manifest: no such file" >&2; exit 2; }
    manifest="$(cd "$(dirname "$manifest")" && pwd)/$(basename "$manifest")"
    crate_dir="$(dirname "$manifest")"
    out_dir="${out_dir:-$crate_dir/target}"
    target_dir="${target_dir:-$crate_dir/target/wasm32}"
else
    manifest="$here/Cargo.toml"
    out_dir="${out_dir:-${PODSTAMP_PLUGIN_DIR:-$repo/target/plugins}}"
    target_dir="${target_dir:-$repo/target/wasm32}"
fi
target=wasm32-unknown-unknown
profile="${PODSTAMP_PLUGIN_PROFILE:-release}"
wasm_tools_version=1.263.0
allowed_imports=("podstamp:plugin/host@0.1.1" "podstamp:plugin/types@0.1.1")
required_exports=("podstamp:plugin/transformer@0.1.1" "podstamp:plugin/settings-validator@0.1.1")

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
if [[ "$manifest" == "$here/Cargo.toml" ]]; then
    for member in "$here"/*/Cargo.toml; do
        if grep -Eq '^crate-type *= *\[ *"cdylib" *\]' "$member"; then
            plugins+=("$(basename "$(dirname "$member")")")
        fi
    done
    ((${#plugins[@]} > 0)) || die "no plugin crates (crate-type = [\"cdylib\"]) under $here"
else
    # The [package] name of the one crate given.
    name="$(awk '/^\[/{p = ($0 == "[package]")} p && /^name *=/{gsub(/^name *= *"|".*$/, ""); print; exit}' "$manifest")"
    [[ -n "$name" ]] || die "$manifest: no [package] name (a plugin is one crate)"
    grep -Eq '^crate-type *= *\[ *"cdylib"' "$manifest" ||
        die "$manifest: the crate must be a cdylib ([lib] crate-type = [\"cdylib\"])"
    plugins=("$name")
fi

package_args=()
for name in "${plugins[@]}"; do package_args+=(-p "$name"); done

say "building ${plugins[*]} for $target ($profile profile)"
# A clean environment: only Debian's toolchain on PATH (not rustup's proxies),
# and nothing inherited from an outer cargo (RUSTFLAGS, jobserver, wrappers).
clean_env=(env -i "HOME=$HOME" "PATH=/usr/bin:/bin" "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}")
for var in TERM CARGO_NET_OFFLINE CARGO_BUILD_JOBS CARGO_TERM_COLOR http_proxy https_proxy; do
    if [[ -n "${!var:-}" ]]; then clean_env+=("$var=${!var}"); fi
done
# The profiles: every plugin crate, in this tree or not, is built alike.
profile_env=(
    CARGO_PROFILE_RELEASE_PANIC=abort # a panic traps; the SDK's hook logs it first
    # Speed over size: a call runs at every render, on every node. At `s`
    # the example chain's three calls took 15 µs more (docs/performance.md
    # §11.1) for components a third smaller (~200 against ~300 KB).
    CARGO_PROFILE_RELEASE_OPT_LEVEL=3
    # Fat LTO halves a typed plugin but makes relinking one take a minute or two.
    CARGO_PROFILE_RELEASE_LTO=true
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1
    CARGO_PROFILE_RELEASE_STRIP=debuginfo
    CARGO_PROFILE_QUICK_INHERITS=release
    CARGO_PROFILE_QUICK_LTO=false
    CARGO_PROFILE_QUICK_CODEGEN_UNITS=16
)
"${clean_env[@]}" "${profile_env[@]}" \
    RUSTC=/usr/bin/rustc \
    RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-16 \
    CARGO_TARGET_DIR="$target_dir" \
    /usr/bin/cargo build --manifest-path "$manifest" --profile "$profile" \
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
    local export
    for export in "${required_exports[@]}"; do
        awk '/^world /{w=1; next} w && /^}/{exit} w' <<<"$wit" | grep -qx "  export $export;" ||
            die "$file does not export $export"
    done
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
