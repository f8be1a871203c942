"""The Python SDK for podstamp plugins (componentize-py).

A plugin is one module with a function decorated by `plugin`:

    from dataclasses import dataclass
    from podstamp_plugin import Error, plugin

    @dataclass
    class Settings:
        label: str = "arch"

    @plugin("arch-label", "0.1.0", Settings)
    def transform(pod: dict, node, settings: Settings):
        if not node.architecture:
            raise Error("the host did not say the node's architecture")
        pod["metadata"].setdefault("labels", {})[settings.label] = node.architecture

`transform` gets the pod as a dict (parsed from the host's JSON), the Node,
and the settings parsed into the dataclass; it changes the pod in place (or
returns a new dict). Raising `Error` refuses the pod, with a field path when
it is about one field. Any other exception is logged at error level, then
the call traps, as a panic does in the Rust SDK.

Settings are checked when the host loads its catalog (WIT 0.1.1's
`validate-settings`): parsed into the dataclass, then given to the
decorator's `validate(settings)`, if any, which raises `Error` (its field a
path inside the settings) for settings that parse but are not good.

Invariants: the decorator defines the module's `Transformer` and
`SettingsValidator` classes, which componentize-py exports for the world's
`transformer` and `settings-validator` interfaces; the
bindings (`wit_world`, `componentize_py_types`) are imported only inside the
component, so the same module runs natively in unit tests through `run`.
"""

import json
import traceback

from . import log
from .error import Error, FieldPath, quote
from .node import Node, NodeAddress
from .settings import check_settings, json_name, parse_settings

try:  # Only inside the component.
    from componentize_py_types import Err as _Err
    from wit_world.imports.types import PluginError as _PluginError
    from wit_world.imports.types import PluginInfo as _PluginInfo
except ImportError:
    _Err = _PluginError = _PluginInfo = None

__all__ = [
    "Error",
    "FieldPath",
    "Node",
    "NodeAddress",
    "containers",
    "json_name",
    "log",
    "parse_settings",
    "plugin",
    "quote",
    "run",
    "validate_settings",
]


def parse_pod(text: str) -> dict:
    """The pod as a dict, or Error."""
    try:
        pod = json.loads(text)
    except ValueError as e:
        raise Error(f"invalid pod: not valid JSON: {e}") from None
    if not isinstance(pod, dict):
        raise Error("invalid pod: not a JSON object")
    return pod


def run(transform, pod: str, node: Node, settings: str = "{}") -> str:
    """Does what the host's call does: parses the settings and the pod, runs
    the decorated `transform` and writes the pod back as JSON. For tests."""
    spec = transform.__podstamp_plugin__
    parsed = parse_settings(settings, spec["settings"])
    doc = parse_pod(pod)
    out = transform(doc, node, parsed)
    if out is None:
        out = doc
    if not isinstance(out, dict):
        raise Error("the plugin returned something other than a pod (a dict)")
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def validate_settings(transform, settings: str = "{}") -> None:
    """Does what the host's `validate-settings` call does: parses the
    settings and runs the decorator's `validate`; raises Error, its field a
    path inside the settings. For tests."""
    spec = transform.__podstamp_plugin__
    parsed = check_settings(settings, spec["settings"])
    if spec["validate"] is not None:
        spec["validate"](parsed)


def plugin(name: str, version: str, settings=None, validate=None):
    """Makes the decorated `transform(pod, node, settings)` the plugin.

    `name` and `version` are what `info()` returns. `settings` is a
    dataclass (see `parse_settings`), `dict` for the raw JSON object, or None
    for a plugin that takes none. `validate(settings)`, if given, checks
    parsed settings when the host loads them, raising Error."""

    def wrap(transform):
        transform.__podstamp_plugin__ = {
            "name": name,
            "version": version,
            "settings": settings,
            "validate": validate,
        }
        transform.__globals__["Transformer"] = _exporter(transform)
        transform.__globals__["SettingsValidator"] = _validator(transform)
        return transform

    return wrap


def _exporter(transform):
    spec = transform.__podstamp_plugin__

    class Transformer:
        """The `transformer` export, for componentize-py."""

        def info(self):
            return _PluginInfo(name=spec["name"], version=spec["version"])

        def transform(self, pod, node, settings):
            try:
                return run(transform, pod, Node.from_wit(node), settings)
            except Error as e:
                raise _Err(_PluginError(message=e.message, field=e.field)) from None
            except Exception as e:
                frame = traceback.extract_tb(e.__traceback__)[-1]
                at = f"{frame.filename}:{frame.lineno}"
                log.error(f"uncaught {type(e).__name__} at {at}: {e}")
                raise

    return Transformer


def _validator(transform):
    class SettingsValidator:
        """The `settings-validator` export, for componentize-py."""

        def validate_settings(self, settings):
            try:
                validate_settings(transform, settings)
            except Error as e:
                raise _Err(_PluginError(message=e.message, field=e.field)) from None
            except Exception as e:
                frame = traceback.extract_tb(e.__traceback__)[-1]
                log.error(f"uncaught {type(e).__name__} at {frame.filename}:{frame.lineno}: {e}")
                raise

    return SettingsValidator


def containers(pod: dict, init: bool = False):
    """The (path, container) pairs of `spec.containers`, or of
    `spec.initContainers` when `init`: e.g. (`spec.containers[0]`, {...})."""
    key = "initContainers" if init else "containers"
    items = (pod.get("spec") or {}).get(key) or []
    base = FieldPath("spec").key(key)
    return [(base.index(i), c) for i, c in enumerate(items)]
