#!/usr/bin/env bash
# The whole loop on one machine: a real API server, real kubelets (each with
# its containerd: the test harness's podstamp-node) and podstamp's daemon
# for each, then the commands a user types, printed and run: the template
# applied, its pods running, an edit rolled node by node (`podstamp status`
# at each step), a bad edit (an image that is not there) failed on one node,
# rolled back there and halted for the others. The cluster then stays up
# for your own edits until Ctrl-C.
#
#   bash examples/playground.sh [up] [--no-wait]   # build what is missing, start, walk the loop
#   bash examples/playground.sh down               # stop everything by PID, unmount, remove the state
#
# Runs as root (containerd, mounts, cgroups; tests/harness/node-deps.sh
# installs containerd, runc and busybox-static). State in
# PODSTAMP_PLAYGROUND_DIR (default /tmp/podstamp-playground: short, for
# containerd's socket path), PODSTAMP_PLAYGROUND_NODES nodes (default 2).
# --no-wait returns once the walk is done, leaving the cluster up (for
# tests/playground.rs, which then runs `down`). PODSTAMP_BIN names a
# podstamp binary to use instead of building one; PODSTAMP_PLAYGROUND_NO_BUILD=1
# skips building the plugins and the harness (already built).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
state="${PODSTAMP_PLAYGROUND_DIR:-/tmp/podstamp-playground}"
count="${PODSTAMP_PLAYGROUND_NODES:-2}"
ns=playground
harness="${PODSTAMP_HARNESS_BIN:-$repo/target/harness}"

say() { printf '\n==> %s\n' "$*"; }
die() {
    echo "playground.sh: error: $*" >&2
    exit 1
}
# A command as the user would type it, printed, then run.
show() {
    printf '\n$ %s\n' "$*"
    "$@"
}

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
    local limit="$1" what="$2"
    shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || die "timed out after ${limit}s waiting for $what (logs in $state)"
        sleep 0.5
    done
}

# The pid in a harness ready file, if it is $2's.
ready_pid() { grep -q "\"pid\":$2[,}]" "$1" 2>/dev/null; }

# Starts a process in a session of its own (a Ctrl-C reaches only this
# script, which stops them in order) and records its PID and program.
start() {
    local name="$1"
    shift
    setsid "$@" >"$state/$name.log" 2>&1 </dev/null &
    echo "$! $name $1" >>"$state/pids"
    echo "$!"
}

down() {
    if [[ ! -d "$state" ]]; then
        echo "playground.sh: nothing to stop ($state does not exist)"
        return 0
    fi
    # The daemons, then the nodes (each tears down its kubelet, pods,
    # containerd, mounts and cgroups on SIGTERM), then the API server.
    if [[ -f "$state/pids" ]]; then
        local pid name program
        while read -r pid name program; do
            # Only our process: the PID still runs the program we started.
            [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$program")" ]] || continue
            echo "playground.sh: stopping $name (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            local end=$((SECONDS + 60))
            while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
            if kill -0 "$pid" 2>/dev/null; then
                echo "playground.sh: $name (pid $pid) still runs after 60 s: SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
            fi
        done < <(tac "$state/pids")
    fi
    # Whatever a node could not unmount (it unmounts all it made), deepest first.
    local mounts
    mounts="$(awk -v dir="$state/" 'index($2, dir) == 1 {print $2}' /proc/mounts | sort -r)"
    if [[ -n "$mounts" ]]; then
        echo "playground.sh: unmounting what is left under $state"
        while read -r m; do umount -l "$m" || true; done <<<"$mounts"
    fi
    rm -rf "$state"
    echo "playground.sh: stopped; $state removed"
}

up() {
    local wait=1
    for arg in "$@"; do
        case "$arg" in
        --no-wait) wait=0 ;;
        *) die "unknown argument $arg (usage: playground.sh [up] [--no-wait] | down)" ;;
        esac
    done
    [[ "$(id -u)" == 0 ]] || die "run it as root: each node runs containerd and the kubelet"
    command -v kubectl >/dev/null || die "kubectl is missing: install kubectl (1.27 or later) on PATH"

    if [[ "${PODSTAMP_PLAYGROUND_NO_BUILD:-}" != 1 ]]; then
        say "building what is missing: the plugins, the harness (API server, kubelet, node), podstamp's pod check, the node's packages"
        bash plugins/build.sh
        bash tests/harness/build.sh
        bash tests/harness/build-kubecheck.sh
        bash tests/harness/node-deps.sh
    fi
    local podstamp="${PODSTAMP_BIN:-}"
    if [[ -z "$podstamp" ]]; then
        bash tests/harness/build-deps.sh
        cargo build --locked --bin podstamp
        podstamp="${CARGO_TARGET_DIR:-$repo/target}/debug/podstamp"
    fi
    [[ -x "$podstamp" ]] || die "$podstamp is not a podstamp binary"
    podstamp="$(readlink -f "$podstamp")"
    # What an earlier run left, stopped and removed first.
    if [[ -d "$state" ]]; then down >/dev/null; fi
    # `podstamp` in the commands below, as the user types it.
    mkdir -p "$state/bin"
    ln -s "$podstamp" "$state/bin/podstamp"
    ln -s "$podstamp" "$state/bin/kubectl-podstamp"
    export PATH="$state/bin:$PATH"

    say "the API server (podstamp-apiserver: etcd and kube-apiserver on 127.0.0.1)"
    local pid
    pid="$(start apiserver "$harness/podstamp-apiserver" --dir "$state/apiserver")"
    wait_for 120 "the API server" ready_pid "$state/apiserver/ready" "$pid"
    export KUBECONFIG="$state/apiserver/admin.kubeconfig"
    show kubectl create namespace "$ns"
    # Where the daemons coordinate their rollouts (Leases), as on a cluster.
    show kubectl apply -f deploy/namespace.yaml

    local i node
    for ((i = 1; i <= count; i++)); do
        node="pg-$i"
        say "node $node: containerd and the kubelet (podstamp-node), then podstamp's daemon"
        pid="$(start "node-$i" "$harness/podstamp-node" --dir "$state/n$i" --kubeconfig "$KUBECONFIG" --node-name "$node")"
        wait_for 120 "node $node" ready_pid "$state/n$i/ready" "$pid"
        mkdir -p -m 0700 "$state/cache"
        pid="$(start "podstamp-$i" env PODSTAMP_CACHE_DIR="$state/cache" PODSTAMP_REVISIONS_DIR="$state/revisions-$i" \
            "$podstamp" --log-level info run --config examples/playground/podstamp.yaml \
            --kubeconfig "$KUBECONFIG" --node-name "$node" --manifest-dir "$state/n$i/manifests" \
            --listen "127.0.0.1:$((19463 + i))")"
        # `env` execs podstamp: the same PID, recorded as podstamp's.
        sed -i "s|^$pid podstamp-$i .*|$pid podstamp-$i $podstamp|" "$state/pids"
        wait_for 120 "podstamp on $node" curl -sf "http://127.0.0.1:$((19463 + i))/readyz"
    done
    show kubectl get nodes

    say "a PodTemplate in the API server; each node's podstamp renders it into its kubelet's manifest directory"
    show kubectl apply -f examples/playground/web.yaml
    wait_for 120 "web running on every node" all_running
    show kubectl get pods -n "$ns" -o wide
    follow 120 "every node reports web ready" rolled_out
    # What node pg-1 runs, as podstamp rendered it for that node.
    show kubectl get pod web-pg-1 -n "$ns" -o jsonpath='{.spec.containers[0].command[2]}{"\n"}'

    say "an edit: it rolls node by node (one at a time, each confirmed Ready before the next)"
    show kubectl patch podtemplate web -n "$ns" --type json \
        -p '[{"op": "replace", "path": "/template/spec/containers/0/command/2", "value": "echo web version 2 on ${node.name}; exec sleep 3600"}]'
    follow 180 "every node ready on the new target" rolled_out
    show kubectl get pods -n "$ns" -o wide
    show kubectl get pod web-pg-1 -n "$ns" -o jsonpath='{.spec.containers[0].command[2]}{"\n"}'

    say "a bad edit, an image that is not there: it fails on the first node, is rolled back there, and halts the others"
    show kubectl patch podtemplate web -n "$ns" --type json \
        -p '[{"op": "replace", "path": "/template/spec/containers/0/image", "value": "podstamp.test/not-there:1"}]'
    follow 180 "the failure on one node and the others halted" halted
    wait_for 60 "web running again on every node" all_running
    show kubectl get pods -n "$ns" -o wide

    cat <<EOF

==> the playground is up: try your own edits
  export KUBECONFIG=$KUBECONFIG
  export PATH=$state/bin:\$PATH
  kubectl edit podtemplate web -n $ns
  podstamp status -n $ns --watch        # or: kubectl podstamp status -n $ns --watch
Stop it with Ctrl-C here, or: bash examples/playground.sh down
EOF
    if ((wait)); then
        trap 'echo; down; exit 0' INT TERM
        while true; do sleep 1; done
    fi
}

# Every node's mirror pod of web is Running.
all_running() {
    local phases
    phases="$(kubectl get pods -n "$ns" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')"
    [[ "$(grep -c '^Running$' <<<"$phases")" == "$count" ]]
}

# `podstamp status -o json` of web, asked with python3: (target, phases).
status_says() {
    local json
    json="$(podstamp status -n "$ns" web -o json 2>/dev/null)" || return 1
    python3 -c "
import json, sys
view = json.load(sys.stdin)['templates'][0]
nodes = view['nodes']
mode = sys.argv[1]
if mode == 'rolled':
    ok = len(nodes) == $count and all(n['phase'] == 'ready' and n.get('target') == view.get('target') for n in nodes)
else:
    failed = [n for n in nodes if (n.get('failed') or {}).get('target') == view.get('target')]
    ok = len(failed) == 1 and all(n['phase'] in ('halted', 'ready') for n in nodes if n not in failed) and any(n['phase'] == 'halted' for n in nodes)
sys.exit(0 if ok else 1)
" "$1" <<<"$json"
}
rolled_out() { status_says rolled; }
halted() { status_says halted; }

# Prints `podstamp status` each time it changes, until $3 holds (at most $1 s).
follow() {
    local limit="$1" what="$2" done_when="$3" last="" now
    local end=$((SECONDS + limit))
    printf '\n$ podstamp status -n %s --watch     (until %s)\n' "$ns" "$what"
    while true; do
        now="$(podstamp status -n "$ns" 2>&1 || true)"
        if [[ "$now" != "$last" ]]; then
            printf '\n%s\n' "$now"
            last="$now"
        fi
        "$done_when" && return 0
        ((SECONDS < end)) || die "timed out after ${limit}s waiting for $what (logs in $state)"
        sleep 1
    done
}

case "${1:-up}" in
up)
    shift || true
    up "$@"
    ;;
down) down ;;
--no-wait) up "$@" ;;
*) die "usage: playground.sh [up] [--no-wait] | down" ;;
esac
