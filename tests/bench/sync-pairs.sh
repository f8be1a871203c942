#!/usr/bin/env bash
# Runs the sync part of the daemon bench once per podstamp binary given, in
# the order given, each in the place the bench copies podstamp from; before
# each run the last run's files are removed, the disks flushed and the
# kernel's caches dropped, 20 s ahead. Compare binaries in alternating pairs
# (A B B A) all the same.
#
#   tests/bench/sync-pairs.sh BENCH_EXE OUT_DIR podstamp.A podstamp.B podstamp.B podstamp.A
#
# BENCH_EXE: target/release/deps/daemon-<hash> (cargo bench -p podstamp
# --bench daemon --no-run prints it); the binaries: release builds of
# podstamp, kept apart. Root (to drop the caches, and to mount). Prints a
# line a run; the bench's whole output is in OUT_DIR.
#
# SYNC_FS=journal (the default): each run's files (the bench's whole
# directory: manifests, revisions, the API server's state) are on a fresh
# ext4 *with* a journal, loop-mounted from an image in target/ and
# unmounted after the run, pass or fail: what a node's /etc/kubernetes
# sits on. SYNC_FS=root: on this machine's root file system as it is
# (here an ext4 without a journal, which makes every inode allocation pass
# over the inodes deleted recently: docs/performance.md 3.7 and 3.8).
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,13p "$0"; exit 2; }
bench=$(realpath "$1"); out=$2; shift 2
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Where the bench copies podstamp from: its build's own binary.
target="$(dirname "$(dirname "$bench")")/podstamp"
[ -e /proc/sys/vm/drop_caches ] && [ -w /proc/sys/vm/drop_caches ] \
  || { echo "sync-pairs: run as root (it drops the kernel's caches between runs)" >&2; exit 2; }
fs=${SYNC_FS:-journal}
case "$fs" in journal|root) ;; *) echo "sync-pairs: SYNC_FS is journal or root, not $fs" >&2; exit 2;; esac
if [ "$fs" = journal ]; then
  command -v mkfs.ext4 >/dev/null || { echo "sync-pairs: mkfs.ext4 missing (apt-get install e2fsprogs), or SYNC_FS=root" >&2; exit 2; }
fi
mkdir -p "$out"
root="$repo/target/bench-daemon"
image="$repo/target/bench-daemon.ext4"
unmount() {
  if mountpoint -q "$root"; then umount "$root"; fi
  rm -f "$image"
}
trap unmount EXIT
cd "$repo/host"
for binary in "$@"; do
  # A copy, not in place: cargo's hard link to its own build stays whole.
  cp --remove-destination "$binary" "$target"
  # The last run's files are removed here, before the flush and the drop,
  # not by the bench as it starts: on an ext4 without a journal (this
  # machine's root), allocating an inode passes over the ones deleted
  # recently whose inode table blocks are cached (ext4's recently_deleted()),
  # so a sync just after removing thousands of files paid for them in every
  # creat(2), more with each run of a sitting (docs/performance.md 3.7).
  unmount
  rm -rf "$root"
  if [ "$fs" = journal ]; then
    mkdir -p "$root"
    truncate -s 4G "$image"
    mkfs.ext4 -q -F "$image"
    # The loop device goes with the unmount (autoclear).
    mount -o loop "$image" "$root"
  fi
  sync
  echo 3 > /proc/sys/vm/drop_caches
  sleep 20
  n=$(find "$out" -maxdepth 1 -name '*.txt' | wc -l)
  log="$out/$n-$(basename "$binary").txt"
  rc=0
  PODSTAMP_KUBECHECK="$repo/target/kubecheck/podstamp-kubecheck" timeout 600 "$bench" --bench sync > "$log" 2>&1 || rc=$?
  unmount
  echo "$n $(basename "$binary") ($fs) rc $rc: $(grep -E 'podstamp_initial_sync_seconds' "$log" | awk '{print $2, $3}') $(grep -o '= [0-9.]*x the poller' "$log" || true)"
done
