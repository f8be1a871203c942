#!/usr/bin/env python3
"""The pod check's helper on its own: start to first verdict, warm calls on a
small pod and on the full-field fixture (the kubelet's check, and beside it
the Pod Security request at baseline and restricted), the memory it holds. Prints figures,
asserts nothing (docs/performance.md, "The kubelet's check").

Usage: python3 tests/bench/kubecheck.py [target/kubecheck/podstamp-kubecheck]
Needs PyYAML (python3-yaml) for the fixture.
"""
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPER = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "target/kubecheck/podstamp-kubecheck")
# What podstamp gives it (host/src/kube_check/helper.rs).
ENV = {"GOMAXPROCS": "1", "GOMEMLIMIT": "256MiB"}

SMALL = b"""apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: kube-system
  labels: {app: web}
spec:
  hostNetwork: true
  containers:
  - name: main
    image: registry.example.com/web:1
    command: [/bin/web, --port=8443]
    env: [{name: A, value: b}]
    ports: [{containerPort: 8443, name: https}]
    livenessProbe: {httpGet: {port: 8443, path: /healthz}, periodSeconds: 10}
    resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 256Mi}}
    volumeMounts: [{name: etc, mountPath: /etc/web, readOnly: true}]
  volumes: [{name: etc, hostPath: {path: /etc/web}}]
"""


def start():
    began = time.perf_counter()
    p = subprocess.Popen([HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV)
    read(p)
    return p, time.perf_counter() - began


def read(p):
    n = struct.unpack("<I", p.stdout.read(4))[0]
    return json.loads(p.stdout.read(n))


def call(p, manifest, node=b"n1", kubelet=b""):
    request = node + b"\0" + kubelet + b"\0" + manifest
    p.stdin.write(struct.pack("<I", len(request)) + request)
    p.stdin.flush()
    return read(p)


def pod_security(p, manifest, level, version=b"latest"):
    request = b"\x01pod-security\0" + level + b"\0" + version + b"\0" + manifest
    p.stdin.write(struct.pack("<I", len(request)) + request)
    p.stdin.flush()
    return read(p)


def status_kib(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def main():
    print(f"pod check helper benchmark: python3 tests/bench/kubecheck.py ({HELPER}, {os.path.getsize(HELPER) / 1e6:.1f} MB)")
    starts, firsts = [], []
    for _ in range(20):
        p, took = start()
        began = time.perf_counter()
        call(p, SMALL)
        firsts.append((time.perf_counter() - began) * 1e3)
        starts.append(took * 1e3)
        p.stdin.close()
        p.wait()
    print(f"  start -> hello              median {statistics.median(starts):6.1f} ms   max {max(starts):6.1f} ms  (20 starts)")
    print(f"  first verdict after hello   median {statistics.median(firsts):6.1f} ms   max {max(firsts):6.1f} ms")
    fixture = yaml.safe_load(open(os.path.join(REPO, "tests/fixtures/kubecheck/full.yaml")))
    full = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "full"},
                       "spec": fixture["template"]["spec"]}).encode()
    p, _ = start()
    for label, manifest, kubelet in [
        (f"small pod ({len(SMALL)} B)", SMALL, b""),
        (f"full-field pod ({len(full)} B)", full, b""),
        (f"full-field pod, kubelet v1.34.0", full, b"v1.34.0"),
    ]:
        for _ in range(50):
            call(p, manifest, kubelet=kubelet)
        times = []
        for _ in range(1000):
            began = time.perf_counter()
            verdict = call(p, manifest, kubelet=kubelet)
            times.append((time.perf_counter() - began) * 1e6)
            assert verdict["ok"], verdict
        times.sort()
        print(f"  warm call, {label:<32} p50 {times[500]:6.0f} µs   p99 {times[990]:6.0f} µs  (1000 calls)")
    # The Pod Security request on the same process, side by side with the
    # kubelet's check of the same bytes (both refuse or allow: timed alike).
    for label, manifest in [(f"small pod ({len(SMALL)} B)", SMALL), (f"full-field pod ({len(full)} B)", full)]:
        for name, ask in [
            ("kubelet check", lambda m: call(p, m)),
            ("Pod Security baseline", lambda m: pod_security(p, m, b"baseline")),
            ("Pod Security restricted", lambda m: pod_security(p, m, b"restricted")),
        ]:
            for _ in range(50):
                ask(manifest)
            times = []
            for _ in range(1000):
                began = time.perf_counter()
                verdict = ask(manifest)
                times.append((time.perf_counter() - began) * 1e6)
                assert "bad" not in verdict, verdict
            times.sort()
            print(f"  {name:<24} {label:<26} p50 {times[500]:6.0f} µs   p99 {times[990]:6.0f} µs  (1000 calls)")
    print(f"  helper RSS after them       {status_kib(p.pid, 'VmRSS') / 1024:6.1f} MiB   (peak {status_kib(p.pid, 'VmHWM') / 1024:.1f} MiB)")
    p.stdin.close()
    p.wait()


main()
