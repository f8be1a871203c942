#!/usr/bin/env bash
# The baseline podstamp is compared with (host/benches/daemon.rs): what a
# platform team writes by hand today, like the bootkube checkpointer's poll
# loop. Every INTERVAL seconds it lists the selected PodTemplates with kubectl
# and writes each one's pod as a static pod manifest, atomically (a dot temp
# file in the same directory, then mv) and only when the content changed. No
# plugins, no removal of manifests whose template went away.
#
# Usage: kubectl-poller.sh NAMESPACE SELECTOR DIR [INTERVAL]
#   KUBECONFIG picks the cluster; POLL_ONCE=1 does one sweep and exits.
set -uo pipefail

if ! command -v kubectl >/dev/null || ! command -v jq >/dev/null; then
    echo "kubectl-poller: needs kubectl and jq: apt-get install kubectl jq" >&2
    exit 2
fi
if [[ $# -lt 3 ]]; then
    echo "usage: $0 NAMESPACE SELECTOR DIR [INTERVAL]" >&2
    exit 2
fi
ns=$1 selector=$2 dir=$3 interval=${4:-1}
mkdir -p "$dir"

sweep() {
    # One line per template: its name, a tab, the Pod as one line of JSON
    # (JSON is YAML, which the kubelet reads).
    kubectl get podtemplates -n "$ns" -l "$selector" -o json |
        jq -r --arg ns "$ns" '.items[] | "\(.metadata.name)\t\({
            apiVersion: "v1", kind: "Pod",
            metadata: ((.template.metadata // {}) + {name: .metadata.name, namespace: $ns}),
            spec: .template.spec} | tojson)"' |
        while IFS=$'\t' read -r name pod; do
            file="$dir/$name.yaml"
            # $(<file) drops the trailing newline that printf adds below.
            if [[ -f $file && $(<"$file") == "$pod" ]]; then
                continue
            fi
            printf '%s\n' "$pod" >"$dir/.$name.yaml.tmp" && mv -f "$dir/.$name.yaml.tmp" "$file"
        done
}

while true; do
    if ! sweep; then
        echo "kubectl-poller: the sweep failed" >&2
        [[ ${POLL_ONCE:-} == 1 ]] && exit 1
    fi
    [[ ${POLL_ONCE:-} == 1 ]] && exit 0
    sleep "$interval"
done
