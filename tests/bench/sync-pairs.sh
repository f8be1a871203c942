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
# podstamp, kept apart. Root (to drop the caches). Prints a line a run; the
# bench's whole output is in OUT_DIR.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,13p "$0"; exit 2; }
bench=$(realpath "$1"); out=$2; shift 2
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Where the bench copies podstamp from: its build's own binary.
target="$(dirname "$(dirname "$bench")")/podstamp"
[ -e /proc/sys/vm/drop_caches ] && [ -w /proc/sys/vm/drop_caches ] \
  || { echo "sync-pairs: run as root (it drops the kernel's caches between runs)" >&2; exit 2; }
mkdir -p "$out"
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
  rm -rf "$repo/target/bench-daemon"
  sync
  echo 3 > /proc/sys/vm/drop_caches
  sleep 20
  n=$(find "$out" -maxdepth 1 -name '*.txt' | wc -l)
  log="$out/$n-$(basename "$binary").txt"
  rc=0
  PODSTAMP_KUBECHECK="$repo/target/kubecheck/podstamp-kubecheck" timeout 600 "$bench" --bench sync > "$log" 2>&1 || rc=$?
  echo "$n $(basename "$binary") rc $rc: $(grep -E 'podstamp_initial_sync_seconds' "$log" | awk '{print $2, $3}') $(grep -o '= [0-9.]*x the poller' "$log" || true)"
done
