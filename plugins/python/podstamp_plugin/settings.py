"""Settings parsed from the JSON the host passes, into a dataclass.

Invariant: the messages are those of the Rust SDK (serde_json through
serde_path_to_error), for the same settings and the same shape of type, so a
plugin ported from Rust fails the same way:
`invalid settings at vars.a: invalid type: integer `1`, expected a string`.

Field names are the dataclass's in camelCase (`init_containers` ->
`initContainers`), or `field(metadata={"json": "nodeIP"})`. Unknown fields
are refused; a field without a default is required. Supported annotations:
str, bool, int, float, list[T], dict[str, T], Optional[T], another dataclass,
dict / list / Any (any JSON, as is).
"""

import dataclasses
import json
import typing

from .error import Error, FieldPath, quote


class _Invalid(Exception):
    def __init__(self, path: FieldPath, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def json_name(f: dataclasses.Field) -> str:
    """The JSON name of a dataclass field."""
    if "json" in f.metadata:
        return f.metadata["json"]
    head, *rest = f.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _unexpected(value) -> str:
    """serde_json's words for a value of the wrong type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{repr(value).replace('e+', 'e')}`"
    if isinstance(value, str):
        return f"string {quote(value)}"
    if isinstance(value, list):
        return "sequence"
    return "map"


def _one_of(names) -> str:
    ticked = [f"`{n}`" for n in names]
    if len(ticked) == 1:
        return ticked[0]
    if len(ticked) == 2:
        return f"{ticked[0]} or {ticked[1]}"
    return "one of " + ", ".join(ticked)


def _expected(tp) -> str:
    origin = typing.get_origin(tp)
    if tp is str:
        return "a string"
    if tp is bool:
        return "a boolean"
    if tp is int:
        return "i64"
    if tp is float:
        return "f64"
    if tp is list or origin is list:
        return "a sequence"
    if tp is dict or origin is dict:
        return "a map"
    if dataclasses.is_dataclass(tp):
        return f"struct {tp.__name__}"
    return "a value"


def _convert(value, tp, path: FieldPath):
    if tp is typing.Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        inner = [a for a in args if a is not type(None)]
        if value is None and len(inner) < len(args):
            return None
        if len(inner) == 1:
            return _convert(value, inner[0], path)
        raise TypeError(f"unsupported settings type {tp!r}")
    wrong = _Invalid(path, f"invalid type: {_unexpected(value)}, expected {_expected(tp)}")
    if tp is str:
        if not isinstance(value, str):
            raise wrong
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        return float(value)
    if tp is list or origin is list:
        if not isinstance(value, list):
            raise wrong
        item = args[0] if args else typing.Any
        return [_convert(v, item, path.index(i)) for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise wrong
        item = args[1] if len(args) == 2 else typing.Any
        return {k: _convert(v, item, path.key(k)) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise wrong
        return _struct(value, tp, path)
    raise TypeError(f"unsupported settings type {tp!r}")


def _struct(value: dict, cls, path: FieldPath):
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    by_name = {json_name(f): f for f in fields}
    kwargs = {}
    for key, item in value.items():
        f = by_name.get(key)
        if f is None:
            if by_name:
                message = f"unknown field `{key}`, expected {_one_of(by_name)}"
            else:
                message = f"unknown field `{key}`, there are no fields"
            raise _Invalid(path.key(key), message)
        kwargs[f.name] = _convert(item, hints[f.name], path.key(key))
    for name, f in by_name.items():
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in kwargs and no_default:
            raise _Invalid(path, f"missing field `{name}`")
    return cls(**kwargs)


def parse_settings(text: str, cls):
    """Parses settings (JSON text; empty counts as `{}`) into `cls`, a
    dataclass, or `dict` for the JSON object as is, or None for a plugin
    that takes no settings (only `{}`). Raises Error naming the field."""
    try:
        return _parse(text, cls)
    except _Invalid as e:
        where = "" if e.path.is_root() else f" at {e.path}"
        raise Error(f"invalid settings{where}: {e.message}") from None


def check_settings(text: str, cls):
    """`parse_settings` for the host's `validate-settings` call: the same
    checks, but an error's field is its path inside the settings (`vars.a`)
    and its message serde's own, as the Rust SDK's `validate_settings`."""
    try:
        return _parse(text, cls)
    except _Invalid as e:
        if e.path.is_root():
            raise Error(f"invalid settings: {e.message}") from None
        raise Error(e.message, e.path) from None


def _parse(text: str, cls):
    if not text.strip():
        text = "{}"
    try:
        value = json.loads(text)
    except ValueError as e:
        raise _Invalid(FieldPath(), str(e)) from None
    if cls is None:
        if not isinstance(value, dict):
            raise _Invalid(FieldPath(), f"invalid type: {_unexpected(value)}, expected struct NoSettings")
        for key in value:
            raise _Invalid(FieldPath().key(key), f"unknown field `{key}`, there are no fields")
        return None
    return _convert(value, cls, FieldPath())
