"""substitute-py: the `substitute` example plugin in Python.

Replaces placeholders in every string value of the pod (not in map keys):
`${node.name}`, `${node.arch}`, `${node.os}`, `${node.kubeletVersion}`,
`${node.label[KEY]}`, `${node.annotation[KEY]}`, `${node.address.TYPE}` and
`${var.NAME}` (from the settings' `vars`); `$${` is a literal `${`.

It gives the same manifests and the same error messages as the Rust
`substitute` (plugins/substitute): objects are walked in sorted key order,
as the Rust plugin's maps are, so the first bad placeholder is the same one.
"""

from dataclasses import dataclass, field

from podstamp_plugin import Error, FieldPath, Node, plugin, quote

# What it changes, in the catalog's `scope:` syntax (plugins/python/build.sh
# writes it into the component, as the Rust `substitute`'s scope! does): a
# placeholder may be in any string of the metadata or the spec.
PODSTAMP_SCOPE = ["metadata", "spec"]


@dataclass
class Settings:
    vars: dict[str, str] = field(default_factory=dict)


@plugin("substitute-py", "0.1.0", Settings)
def transform(pod: dict, node: Node, settings: Settings):
    walk(pod, FieldPath(), node, settings.vars)


def walk(value, path: FieldPath, node: Node, vars: dict):
    """Expands the strings inside `value`, a dict or a list, in place."""
    items = enumerate(value) if isinstance(value, list) else sorted(value.items())
    for key, item in items:
        at = path.index(key) if isinstance(value, list) else path.key(key)
        if isinstance(item, str) and "${" in item:
            try:
                value[key] = expand(item, node, vars)
            except ValueError as e:
                raise Error.at(at, str(e)) from None
        elif isinstance(item, (dict, list)):
            walk(item, at, node, vars)


def expand(text: str, node: Node, vars: dict) -> str:
    """`text` with its placeholders replaced; ValueError says why not."""
    out, rest = [], text
    while (at := rest.find("$")) >= 0:
        out.append(rest[:at])
        tail = rest[at:]
        if tail.startswith("$${"):
            out.append("${")
            rest = tail[3:]
        elif tail.startswith("${"):
            end = tail.find("}", 2)
            if end < 0:
                raise ValueError(f'unterminated placeholder {quote(tail)}: no closing "}}"')
            out.append(lookup(tail[2:end], node, vars))
            rest = tail[end + 1 :]
        else:
            out.append("$")
            rest = tail[1:]
    out.append(rest)
    return "".join(out)


def lookup(expr: str, node: Node, vars: dict) -> str:
    """The value of the placeholder `${expr}`."""

    def found(value, why: str) -> str:
        if value is None:
            raise ValueError(f'{why} for placeholder "${{{expr}}}"')
        return value

    def inside(prefix: str):
        if expr.startswith(prefix) and expr.endswith("]") and len(expr) > len(prefix):
            return expr[len(prefix) : -1]
        return None

    simple = {"node.name": node.name, "node.arch": node.architecture, "node.os": node.operating_system}
    if expr in simple:
        return simple[expr]
    if expr == "node.kubeletVersion":
        return found(node.kubelet_version, "the host does not know the kubelet's version")
    if (key := inside("node.label[")) is not None:
        return found(node.label(key), f"the node has no label {quote(key)}")
    if (key := inside("node.annotation[")) is not None:
        return found(node.annotation(key), f"the node has no annotation {quote(key)}")
    if expr.startswith("node.address."):
        kind = expr[len("node.address.") :]
        return found(node.address(kind), f"the node has no {kind} address")
    if expr.startswith("var."):
        name = expr[len("var.") :]
        return found(vars.get(name), f"no var {quote(name)} in the settings")
    raise ValueError(f'unknown placeholder "${{{expr}}}"')
