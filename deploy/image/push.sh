#!/usr/bin/env bash
# Pushes the image that deploy/image/build.sh wrote (an OCI layout) to a
# registry with skopeo, keeping its digest, and prints the pushed reference
# pinned by digest: REGISTRY/REPO@sha256:… (on stdout), and on stderr the
# command that points deploy/ at it (run in deploy/image/):
#   kustomize edit set image podstamp=REGISTRY/REPO@sha256:…
#
# Usage: bash deploy/image/push.sh [--layout DIR] REGISTRY/REPO[:TAG] [SKOPEO-COPY-OPTIONS…]
#
#   --layout DIR   the OCI layout (env PODSTAMP_IMAGE_OUT; default
#                  <repo>/target/image/oci, build.sh's default --out)
#   TAG            default: the image's version (its name in the layout,
#                  podstamp:VERSION)
#   everything after the destination goes to `skopeo copy` as it is, e.g.
#     --dest-creds USER:PASSWORD, --dest-authfile FILE (a docker config JSON),
#     --dest-cert-dir DIR (the registry's CA as DIR/ca.crt),
#     --dest-tls-verify=false (a registry on plain HTTP)
#
# The manifest is copied unchanged (--preserve-digests): the digest printed
# is the digest build.sh printed. Needs skopeo (tests/harness/image-deps.sh
# installs it when run as root).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
say() { echo "push.sh: $*" >&2; }
die() {
    say "error: $*"
    exit 1
}

layout="${PODSTAMP_IMAGE_OUT:-$repo/target/image/oci}"
while (($#)); do
    case "$1" in
    --layout) layout="${2:?--layout needs a directory}"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) die "unknown option $1 before the destination (skopeo's options go after it; see --help)" ;;
    *) break ;;
    esac
done
(($#)) || die "no destination: bash deploy/image/push.sh REGISTRY/REPO[:TAG] [skopeo copy options]"
dest="${1#docker://}"
shift
skopeo_args=("$@")

command -v skopeo >/dev/null || bash "$repo/tests/harness/image-deps.sh" || exit 1
[[ -f "$layout/oci-layout" && -f "$layout/index.json" ]] ||
    die "$layout is not an OCI layout: build the image first (bash deploy/image/build.sh)"

# The image's name in the layout: podstamp:VERSION (build.sh writes one).
name="$(grep -o '"org.opencontainers.image.ref.name":"[^"]*"' "$layout/index.json" | head -n1 | cut -d'"' -f4)"
[[ -n "$name" ]] || die "$layout/index.json names no image (org.opencontainers.image.ref.name)"
digest="$(grep -o '"digest":"sha256:[0-9a-f]\{64\}"' "$layout/index.json" | head -n1 | cut -d'"' -f4)"

[[ "$dest" != *@* ]] || die "$dest: give a tag, not a digest (the digest is the image's)"
last="${dest##*/}"
if [[ "$dest" == */* && "$last" == *:* ]]; then
    repository="${dest%:*}"
else
    [[ "$dest" == */* ]] || die "$dest: give REGISTRY/REPO[:TAG], e.g. registry.example.com/podstamp"
    repository="$dest"
    dest="$dest:${name#*:}"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The image is this script's own output: no signature to require.
echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$work/policy.json"
skopeo --policy "$work/policy.json" copy --quiet --preserve-digests \
    --digestfile "$work/digest" "${skopeo_args[@]}" \
    "oci:$layout:$name" "docker://$dest" >&2 ||
    die "skopeo copy oci:$layout:$name docker://$dest failed (above)"
pushed="$(cat "$work/digest")"
[[ "$pushed" == "$digest" ]] || die "the registry has $pushed, not the layout's $digest"
say "pushed $dest"
# deploy/'s manifests name the image `podstamp`: one kustomize edit in the
# component both deploy/ and deploy/static-pod/ include points them at it.
say "point deploy/ (and deploy/static-pod/) at it, in deploy/image/:"
say "  kustomize edit set image podstamp=$repository@$pushed"
echo "$repository@$pushed"
