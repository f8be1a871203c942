#!/usr/bin/env python3
"""Writes PodTemplates at the API server's size limits into a directory, one
per shape that makes a render slow: many labels, annotations, env entries,
containers or strings, one huge string, strings the YAML writer must escape,
structures nested close to serde_json's depth limit.

    python3 tests/bench/big-templates.py DIR [SIZE_BYTES]

SIZE_BYTES (default 1,500,000: etcd's default object limit, 1.5 MiB) is the
target size of each file's JSON. docs/performance.md ("One template on the
render thread") times `podstamp render` of each.
"""

import json
import os
import sys


def template(name, spec, labels=None, annotations=None):
    metadata = {}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": "kube-system"},
        "template": {"metadata": metadata, "spec": spec},
    }


def main_container(**extra):
    return {"name": "main", "image": "registry.k8s.io/pause:3.10", **extra}


def fill(make, size):
    """Items make(0), make(1)... until their JSON is about `size` bytes."""
    items, total, i = [], 0, 0
    while total < size:
        item = make(i)
        total += len(json.dumps(item, separators=(",", ":"))) + 1
        items.append(item)
        i += 1
    return items


def shapes(size):
    room = size - 300  # the rest of the object
    yield "labels", lambda: template(
        "labels",
        {"containers": [main_container()]},
        labels=dict(fill(lambda i: (f"example.com/label-{i:07d}", "v" * 50), room)),
    )
    yield "annotations", lambda: template(
        "annotations",
        {"containers": [main_container()]},
        annotations=dict(fill(lambda i: (f"example.com/a-{i:07d}", "v" * 100), room)),
    )
    yield "env", lambda: template(
        "env",
        {"containers": [main_container(env=fill(lambda i: {"name": f"E{i}", "value": "v"}, room))]},
    )
    yield "containers", lambda: template(
        "containers",
        {"containers": fill(lambda i: {"name": f"c{i}", "image": "registry.k8s.io/pause:3.10"}, room)},
    )
    yield "args", lambda: template(
        "args", {"containers": [main_container(args=fill(lambda i: "a", room))]}
    )
    yield "one-string", lambda: template(
        "one-string", {"containers": [main_container(args=["x" * room])]}
    )
    # Control characters: the YAML writer escapes each as \xNN, 4 bytes for 1.
    yield "escaped", lambda: template(
        "escaped", {"containers": [main_container(args=["\x01" * (room // 6)])]}
    )
    # A Pod has no free-form field, so depth is refused by the schema check
    # when the template is read; 126 levels in all, under serde_json's 128.
    deep = 120
    yield "deep", lambda: template(
        "deep",
        {"containers": [main_container(
            args=fill(lambda i: json.loads("[" * deep + "]" * deep), room)
        )]},
    )


def main():
    out = sys.argv[1]
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 1_500_000
    os.makedirs(out, exist_ok=True)
    for name, make in shapes(size):
        text = json.dumps(make(), separators=(",", ":"))
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            f.write(text)
        print(f"{name}.json {len(text)}")


if __name__ == "__main__":
    main()
