"""The node a pod is rendered for, as the host's `node-context` record.

Invariant: labels and annotations are plain dicts (the host sends them
sorted by key, and dicts keep that order); addresses keep the Node's order.
"""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class NodeAddress:
    """One of the node's addresses."""

    kind: str  # InternalIP, ExternalIP, Hostname, InternalDNS, ExternalDNS
    address: str


@dataclass
class Node:
    """What the host knows about the node."""

    name: str
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)
    addresses: list = field(default_factory=list)  # of NodeAddress
    architecture: str = ""  # Go's naming: amd64, arm64, ppc64le...
    operating_system: str = ""  # linux, windows
    kubelet_version: Optional[str] = None  # e.g. v1.34.2, when known

    def label(self, key: str) -> Optional[str]:
        return self.labels.get(key)

    def annotation(self, key: str) -> Optional[str]:
        return self.annotations.get(key)

    def address(self, kind: str) -> Optional[str]:
        """The first address of this kind, e.g. `address("InternalIP")`."""
        for a in self.addresses:
            if a.kind == kind:
                return a.address
        return None

    @classmethod
    def from_wit(cls, ctx) -> "Node":
        """From the generated bindings' NodeContext."""
        return cls(
            name=ctx.name,
            labels=dict(ctx.labels),
            annotations=dict(ctx.annotations),
            addresses=[NodeAddress(a.kind, a.address) for a in ctx.addresses],
            architecture=ctx.architecture,
            operating_system=ctx.operating_system,
            kubelet_version=ctx.kubelet_version,
        )
