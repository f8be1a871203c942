#!/usr/bin/env bash
# Builds podstamp's container image, reproducibly, with no container engine
# daemon: the same binary, plugins, libraries and CA bundle always give the
# same manifest digest.
#
# Usage: bash deploy/image/build.sh [--bin FILE] [--plugins DIR] [--out DIR]
#                                   [--storage DIR] [--revision REV]
#
#   --bin FILE      the podstamp binary to ship (env PODSTAMP_BIN; default:
#                   `cargo build --release --locked --bin podstamp` in the repo,
#                   then $CARGO_TARGET_DIR or <repo>/target, release/podstamp).
#                   A copy is stripped (objcopy --strip-all); the file is not
#                   changed.
#   --plugins DIR   where arch-image.wasm, node-env.wasm, substitute.wasm and
#                   identity.wasm are (env PODSTAMP_IMAGE_PLUGINS; default:
#                   run `bash plugins/build.sh`, which writes them into
#                   $PODSTAMP_PLUGIN_DIR or <repo>/target/plugins).
#   --kubecheck FILE  podstamp's pod check, podstamp-kubecheck (env
#                   PODSTAMP_IMAGE_KUBECHECK; default: run
#                   `bash tests/harness/build-kubecheck.sh`, which writes
#                   $CARGO_TARGET_DIR or <repo>/target, kubecheck/podstamp-kubecheck).
#                   A static Go binary: no libraries.
#   --out DIR       the OCI layout written (env PODSTAMP_IMAGE_OUT; default
#                   <repo>/target/image/oci). A previous layout there is
#                   replaced; anything else there is refused.
#   --storage DIR   buildah's storage, a scratch directory (env
#                   PODSTAMP_IMAGE_STORAGE; default ~/.cache/podstamp/image).
#                   Never the system's /var/lib/containers.
#   --revision REV  adds the label org.opencontainers.image.revision (env
#                   PODSTAMP_IMAGE_REVISION; default: none, so that the digest
#                   depends only on what the image holds).
#   SOURCE_DATE_EPOCH  the time stamped on every file and on the image
#                   (default 0, 1970-01-01).
#
# Prints the image reference `oci:DIR:podstamp:VERSION`, then
# `digest: sha256:…`, then the compressed and uncompressed sizes (stdout).
# deploy/image/push.sh puts the layout into a registry.
#
# The image (one layer, from scratch): /usr/bin/podstamp; the shared
# libraries `ldd` lists for it (libc, libm, libgcc_s, the dynamic loader),
# copied from this Debian system at the paths the loader looks for them;
# podstamp's pod check /usr/lib/podstamp/podstamp-kubecheck (where podstamp
# looks for it: docs/daemon.md, "What the kubelet refuses");
# the example plugin components in /usr/lib/podstamp/plugins/ (where
# deploy/daemonset.yaml's catalog points); Debian's CA bundle
# /etc/ssl/certs/ca-certificates.crt; /etc/passwd and /etc/group with root
# and nobody; an empty /tmp (1777). Entrypoint /usr/bin/podstamp, command
# `run`; the DaemonSet's args replace the command.
#
# Why buildah (`from scratch`, vfs storage, chroot isolation) rather than
# umoci: buildah is the maintained tool of the two (Debian's umoci is 0.4.7,
# from 2021), it commits straight into an OCI layout with the switches a
# reproducible image needs (--timestamp, which also stamps every file of the
# layer; --omit-history; --identity-label=false), and it needs no daemon and
# no privilege beyond writing its storage directory: `from scratch`, `copy`
# and `commit` run no container, so chroot isolation is never exercised and
# the vfs driver needs no overlay mount. The layer is a single `buildah copy`
# of a staging tree whose modes and owners this script sets, so its entries
# come in the sorted order of the storage walk.
#
# Needs buildah and objcopy: tests/harness/image-deps.sh installs them with
# apt-get when run as root, else says what to install.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
say() { echo "build.sh: $*" >&2; }
die() {
    say "error: $*"
    exit 1
}

bin="${PODSTAMP_BIN:-}"
plugins_dir="${PODSTAMP_IMAGE_PLUGINS:-}"
kubecheck="${PODSTAMP_IMAGE_KUBECHECK:-}"
out="${PODSTAMP_IMAGE_OUT:-$repo/target/image/oci}"
storage="${PODSTAMP_IMAGE_STORAGE:-${HOME:?}/.cache/podstamp/image}"
revision="${PODSTAMP_IMAGE_REVISION:-}"
epoch="${SOURCE_DATE_EPOCH:-0}"
while (($#)); do
    case "$1" in
    --bin) bin="${2:?--bin needs a file}"; shift 2 ;;
    --plugins) plugins_dir="${2:?--plugins needs a directory}"; shift 2 ;;
    --kubecheck) kubecheck="${2:?--kubecheck needs a file}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --storage) storage="${2:?--storage needs a directory}"; shift 2 ;;
    --revision) revision="${2:?--revision needs a value}"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ "$epoch" =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH=$epoch is not a number of seconds"

# --- tools ---------------------------------------------------------------------
bash "$repo/tests/harness/image-deps.sh" || exit 1
command -v ldd >/dev/null || die "ldd is missing: apt-get install -y libc-bin"
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s "$ca_bundle" ]] || die "$ca_bundle is missing: apt-get install -y ca-certificates"

# --- the version and the labels, from the workspace's Cargo.toml ----------------
# host/Cargo.toml says `version.workspace = true`: the value is in the
# workspace's [workspace.package], as are the repository and the licence.
workspace_key() {
    awk -v key="$1" '
        /^\[/ { section = $0 }
        section == "[workspace.package]" && $1 == key && $2 == "=" {
            value = $0; sub(/^[^=]*= *"/, "", value); sub(/".*$/, "", value); print value; exit
        }' "$repo/Cargo.toml"
}
package_key() {
    awk -v key="$1" '
        /^\[/ { section = $0 }
        section == "[package]" && $1 == key && $2 == "=" {
            value = $0; sub(/^[^=]*= *"/, "", value); sub(/".*$/, "", value); print value; exit
        }' "$repo/host/Cargo.toml"
}
if grep -Eq '^version\.workspace *= *true' "$repo/host/Cargo.toml"; then
    version="$(workspace_key version)"
else
    version="$(package_key version)"
fi
[[ -n "$version" ]] || die "no version in host/Cargo.toml nor in the workspace's Cargo.toml"
source_url="$(workspace_key repository)"
licenses="$(workspace_key license)"
description="$(package_key description)"

# --- the inputs ----------------------------------------------------------------
if [[ -z "$bin" ]]; then
    # protoc, for the CRI bindings the build generates (k8s-cri).
    bash "$repo/tests/harness/build-deps.sh"
    say "building the binary: cargo build --release --locked --bin podstamp"
    (cd "$repo" && cargo build --release --locked --bin podstamp >&2)
    bin="${CARGO_TARGET_DIR:-$repo/target}/release/podstamp"
fi
[[ -f "$bin" && -x "$bin" ]] || die "$bin is not an executable file (--bin or PODSTAMP_BIN)"
bin_version="$("$bin" --version 2>/dev/null | head -n1)" || die "$bin --version failed: is it podstamp, for this machine?"
[[ "$bin_version" == "podstamp $version" ]] ||
    die "$bin --version says '$bin_version', not 'podstamp $version' (host/Cargo.toml): give podstamp's binary, rebuilt"

plugin_names=(arch-image identity node-env substitute)
if [[ -z "$plugins_dir" ]]; then
    say "building the plugins: bash plugins/build.sh"
    bash "$repo/plugins/build.sh" >&2
    plugins_dir="${PODSTAMP_PLUGIN_DIR:-$repo/target/plugins}"
fi
for name in "${plugin_names[@]}"; do
    [[ -s "$plugins_dir/$name.wasm" ]] ||
        die "$plugins_dir/$name.wasm is missing: build the plugins with bash plugins/build.sh (or give --plugins DIR)"
done

if [[ -z "$kubecheck" ]]; then
    say "building the pod check: bash tests/harness/build-kubecheck.sh"
    bash "$repo/tests/harness/build-kubecheck.sh" >&2
    kubecheck="${CARGO_TARGET_DIR:-$repo/target}/kubecheck/podstamp-kubecheck"
fi
[[ -f "$kubecheck" && -x "$kubecheck" ]] ||
    die "$kubecheck is not an executable file: build it with bash tests/harness/build-kubecheck.sh (or give --kubecheck FILE)"

# --- the staging tree: every name, mode, owner and time set here ----------------
mkdir -p "$storage"
storage="$(cd "$storage" && pwd)"
work="$(mktemp -d "$storage/build.XXXXXX")"
container=""
cleanup() {
    if [[ -n "$container" ]]; then
        buildah "${storage_args[@]}" rm "$container" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
root="$work/rootfs"
install -d -m 0755 "$root"/usr/bin "$root"/usr/lib/podstamp/plugins "$root"/etc/ssl/certs
install -d -m 1777 "$root"/tmp

objcopy --strip-all "$bin" "$root/usr/bin/podstamp" || die "objcopy --strip-all $bin failed"
chmod 0755 "$root/usr/bin/podstamp"

# The libraries, from what the dynamic loader resolves for this binary:
# `name => /path (addr)` and the loader's own `/path (addr)`; a library that
# is not found is an error, the vDSO (no file) is skipped. Each is copied as
# a file (symlinks resolved) to the path ldd names.
if ldd_out="$(ldd "$bin" 2>&1)"; then
    if grep -q 'not found' <<<"$ldd_out"; then
        die "$bin needs libraries this system lacks: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ' | paste -sd';')"
    fi
    while read -r lib; do
        [[ -z "$lib" ]] && continue
        [[ "$lib" == /* ]] || die "ldd names a library with no absolute path: $lib"
        install -d -m 0755 "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
        chmod 0755 "$root$lib"
    done < <(sed -nE 's/^[[:space:]]*([^[:space:]]+ => )?(\/[^[:space:]]+) \(0x[0-9a-f]+\)$/\2/p' <<<"$ldd_out" | sort -u)
    grep -q 'ld-linux\|ld64\|ld-musl' <<<"$ldd_out" || die "ldd lists no dynamic loader for $bin: $ldd_out"
elif grep -q 'not a dynamic executable\|statically linked' <<<"$ldd_out"; then
    say "$bin is statically linked: no libraries"
else
    die "ldd $bin failed: $ldd_out"
fi

install -m 0755 "$kubecheck" "$root/usr/lib/podstamp/podstamp-kubecheck"
for name in "${plugin_names[@]}"; do
    install -m 0644 "$plugins_dir/$name.wasm" "$root/usr/lib/podstamp/plugins/$name.wasm"
done
install -m 0644 "$ca_bundle" "$root/etc/ssl/certs/ca-certificates.crt"
printf '%s\n' 'root:x:0:0:root:/root:/usr/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"

# Directories 0755 (but /tmp), owner root, one time stamp. (The layer
# carries no other extended attribute than security.capability, which
# nothing here has.)
find "$root" -mindepth 1 -type d ! -path "$root/tmp" -exec chmod 0755 {} +
chown -R 0:0 "$root" 2>/dev/null || true
find "$root" -exec touch -h -d "@$epoch" {} +

# --- buildah, with its own storage and policy, no system configuration ---------
cat >"$work/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$storage/root"
runroot = "$storage/runroot"
EOF
echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$work/policy.json"
export CONTAINERS_STORAGE_CONF="$work/storage.conf"
export BUILDAH_ISOLATION=chroot
storage_args=(--root "$storage/root" --runroot "$storage/runroot" --storage-driver vfs)

# The output: a fresh layout, so that it holds this image alone.
if [[ -e "$out" ]]; then
    if [[ -f "$out/oci-layout" ]] || [[ -d "$out" && -z "$(ls -A "$out")" ]]; then
        rm -rf "$out"
    else
        die "$out exists and is not an OCI layout: give another --out"
    fi
fi
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
reference="oci:$out:podstamp:$version"

started=$SECONDS
container="$(buildah "${storage_args[@]}" from --signature-policy "$work/policy.json" \
    --name "podstamp-image-$$" scratch)"
buildah "${storage_args[@]}" copy --quiet --chown 0:0 "$container" "$root/" / >/dev/null
labels=(
    --label "org.opencontainers.image.title=podstamp"
    --label "org.opencontainers.image.description=$description"
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.source=$source_url"
    --label "org.opencontainers.image.licenses=$licenses"
)
[[ -n "$revision" ]] && labels+=(--label "org.opencontainers.image.revision=$revision")
buildah "${storage_args[@]}" config \
    --entrypoint '["/usr/bin/podstamp"]' --cmd run \
    --env PATH=/usr/bin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --workingdir / \
    "${labels[@]}" "$container"
buildah "${storage_args[@]}" commit --quiet --signature-policy "$work/policy.json" \
    --format oci --timestamp "$epoch" --omit-history --identity-label=false \
    --disable-compression=false --rm "$container" "$reference" >/dev/null
container=""
took=$((SECONDS - started))

# --- what was written ------------------------------------------------------------
digest="$(grep -o '"digest":"sha256:[0-9a-f]\{64\}"' "$out/index.json" | head -n1 | cut -d'"' -f4)"
[[ -n "$digest" ]] || die "no manifest in $out/index.json"
manifest="$out/blobs/sha256/${digest#sha256:}"
[[ "$(sha256sum <"$manifest" | cut -d' ' -f1)" == "${digest#sha256:}" ]] || die "$manifest does not match its digest"
# The layers' sizes as the manifest records them (what a pull transfers), and
# the size of their tar archives uncompressed.
compressed=0
uncompressed=0
while read -r layer; do
    blob="$out/blobs/sha256/${layer#sha256:}"
    compressed=$((compressed + $(stat -c %s "$blob")))
    uncompressed=$((uncompressed + $(gzip -dc "$blob" | wc -c)))
done < <(tr '{' '\n' <"$manifest" | grep 'image.layer' | grep -o '"digest":"sha256:[0-9a-f]\{64\}"' | cut -d'"' -f4)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "committed in ${took}s"
echo "$reference"
echo "digest: $digest"
echo "compressed: $compressed bytes ($(mib "$compressed"))"
echo "uncompressed: $uncompressed bytes ($(mib "$uncompressed"))"
