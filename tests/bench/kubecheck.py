#!/usr/bin/env python3
"""The pod check's helper on its own: start to first verdict, warm calls on a
small pod and on the full-field fixture (the kubelet's check, and beside it
the Pod Security request at baseline and restricted), the memory it holds. Prints figures,
asserts nothing (docs/performance.md, "The kubelet's check").

Usage: python3 tests/bench/kubecheck.py [target/kubecheck/podstamp-kubecheck]
       python3 tests/bench/kubecheck.py --compare OLD NEW   (each [VAR=VALUE,...:]PATH)
Needs PyYAML (python3-yaml) for the fixture.

--compare runs two helpers side by side in one sitting: one process each,
every case asked of each in turn in blocks of 100 calls (10 blocks each,
the first side of a block alternating), so that the machine's load falls on
both alike; it prints each side's p50/p99 and its CPU per call (all its
threads' run time from /proc/PID/task/*/schedstat, which the load does not
inflate as it does the wall time).
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
COMPARE = sys.argv[2:4] if len(sys.argv) == 4 and sys.argv[1] == "--compare" else None
HELPER = COMPARE[0] if COMPARE else (sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "target/kubecheck/podstamp-kubecheck"))
# What podstamp gives it (host/src/kube_check/helper.rs).
ENV = {"GOMAXPROCS": "1", "GOMEMLIMIT": "256MiB"}

# The small pod, shared with the helper's Go benchmark (bench_test.go).
with open(os.path.join(REPO, "tests/fixtures/kubecheck/small.yaml"), "rb") as f:
    SMALL = f.read()


def start(helper=None):
    """Starts a helper: a path, or `VAR=VALUE,...:PATH` to run it with
    those Go settings instead of podstamp's (--compare)."""
    env = dict(ENV)
    helper = helper or HELPER
    if ":" in helper and "=" in helper.split(":", 1)[0]:
        settings, helper = helper.split(":", 1)
        env.update(kv.split("=", 1) for kv in settings.split(","))
    began = time.perf_counter()
    p = subprocess.Popen([helper], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
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


def both(p, manifest, level, node=b"n1", kubelet=b"", version=b"latest"):
    request = b"\x02both\0" + node + b"\0" + kubelet + b"\0" + level + b"\0" + version + b"\0" + manifest
    p.stdin.write(struct.pack("<I", len(request)) + request)
    p.stdin.flush()
    return read(p)


def cpu_ns(pid):
    """The process's run time so far, all threads (schedstat's first field)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def compare(old, new):
    """Both helpers, each case asked of each in turn (see the docstring)."""
    print(f"pod check helper, side by side: python3 tests/bench/kubecheck.py --compare\n  old {old}\n  new {new}")
    print(f"  load average at start: {open('/proc/loadavg').read().split()[:3]}")
    fixture = yaml.safe_load(open(os.path.join(REPO, "tests/fixtures/kubecheck/full.yaml")))
    spec = fixture["template"]["spec"]
    # As podstamp writes it (YAML), and as earlier runs of this script sent it (JSON).
    full_yaml = yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "full"}, "spec": spec}).encode()
    full_json = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "full"}, "spec": spec}).encode()
    sides = {"old": start(old)[0], "new": start(new)[0]}
    cases = [
        (f"kubelet, small pod ({len(SMALL)} B YAML)", lambda p: call(p, SMALL)),
        (f"kubelet, full-field pod ({len(full_yaml)} B YAML)", lambda p: call(p, full_yaml)),
        (f"kubelet, full-field pod ({len(full_json)} B JSON)", lambda p: call(p, full_json)),
        ("kubelet v1.34, small pod", lambda p: call(p, SMALL, kubelet=b"v1.34.0")),
        ("kubelet v1.34, full-field pod (YAML)", lambda p: call(p, full_yaml, kubelet=b"v1.34.0")),
        ("both, restricted, small pod", lambda p: both(p, SMALL, b"restricted")),
        ("both, baseline, full-field pod (YAML)", lambda p: both(p, full_yaml, b"baseline")),
    ]
    for label, ask in cases:
        answers = {name: ask(p) for name, p in sides.items()}
        assert answers["old"] == answers["new"], (label, answers)
        times = {"old": [], "new": []}
        cpu = {"old": 0, "new": 0}
        for block in range(20):
            order = ["old", "new"] if block % 2 == 0 else ["new", "old"]
            for name in order:
                p = sides[name]
                for _ in range(10):
                    ask(p)  # warm this side again after the other's turn
                before = cpu_ns(p.pid)
                for _ in range(50):
                    began = time.perf_counter()
                    ask(p)
                    times[name].append((time.perf_counter() - began) * 1e6)
                cpu[name] += cpu_ns(p.pid) - before
        line = []
        for name in ["old", "new"]:
            t = sorted(times[name])
            n = len(t)
            line.append(f"{name}: p50 {t[n // 2]:6.0f} µs p99 {t[n * 99 // 100]:6.0f} µs CPU {cpu[name] / n / 1e3:6.0f} µs")
        print(f"  {label:<42} {' | '.join(line)}  ({len(times['old'])} calls each)")
    for name, p in sides.items():
        print(f"  {name} helper RSS after them  {status_kib(p.pid, 'VmRSS') / 1024:6.1f} MiB   (peak {status_kib(p.pid, 'VmHWM') / 1024:.1f} MiB)")
        p.stdin.close()
        p.wait()
    print(f"  load average at end: {open('/proc/loadavg').read().split()[:3]}")


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


if COMPARE:
    compare(*COMPARE)
else:
    main()
