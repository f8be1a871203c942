"""{{name}}: a podstamp plugin in Python.

Sets a label on the pod with the node's architecture. Settings (optional):
`label`: the label's key (default `arch`).
"""

from dataclasses import dataclass

from podstamp_plugin import Error, FieldPath, Node, log, plugin


@dataclass
class Settings:
    label: str = "arch"


@plugin("{{name}}", "0.1.0", Settings)
def transform(pod: dict, node: Node, settings: Settings):
    if not node.architecture:
        raise Error("the host did not say the node's architecture")
    metadata = pod.setdefault("metadata", {})
    labels = metadata.setdefault("labels", {})
    if not isinstance(labels, dict):
        raise Error.at(FieldPath("metadata.labels"), "not a map")
    labels[settings.label] = node.architecture
    log.debug(f"label {settings.label} set for node {node.name}")
