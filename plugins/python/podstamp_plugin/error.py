"""Errors with a field path, in the syntax of the Rust SDK's `FieldPath`.

Invariant: a path is text the host shows as is; keys made only of ASCII
letters, digits, `-` and `_` are joined with `.`, any other key is written
as a JSON string in brackets, indexes in brackets:
`spec.containers[0].command[3]`, `metadata.labels["app.kubernetes.io/name"]`.
`quote` formats a string as Rust's `{:?}` does, so that a plugin's messages
can be the same bytes as a Rust plugin's.
"""

import json
import unicodedata


class FieldPath:
    """The path of a field in the pod. Immutable: `key` and `index` return
    a new path. `str(path)` is its text; the root is the empty text."""

    __slots__ = ("_text",)

    def __init__(self, text: str = ""):
        self._text = text

    def key(self, key: str) -> "FieldPath":
        """This path followed by an object key."""
        plain = key != "" and all(
            c.isascii() and (c.isalnum() or c in "-_") for c in key
        )
        if plain:
            return FieldPath(f"{self._text}.{key}" if self._text else key)
        return FieldPath(f"{self._text}[{json.dumps(key, ensure_ascii=False)}]")

    def index(self, index: int) -> "FieldPath":
        """This path followed by an array index."""
        return FieldPath(f"{self._text}[{index}]")

    def is_root(self) -> bool:
        return self._text == ""

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"FieldPath({self._text!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, FieldPath) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)


class Error(Exception):
    """Why a plugin refused to transform a pod: `message` for a human and,
    when it is about one field of the pod, `field` (a path, see FieldPath).
    Raise it from `transform`; the host reports `field: message`."""

    def __init__(self, message: str, field=None):
        super().__init__(message)
        self.message = str(message)
        field = None if field is None else str(field)
        self.field = field or None

    @classmethod
    def at(cls, field, message: str) -> "Error":
        """An error about one field (a FieldPath or its text)."""
        return cls(message, field)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


# Characters Rust's `{:?}` writes as `\u{..}`: not printable, or combining
# marks (grapheme extenders). Python's Unicode tables stand in for Rust's.
_HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs", "Mn", "Me"}
_SHORT = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"'}


def quote(text: str) -> str:
    """`text` in double quotes, escaped as Rust's `format!("{:?}", text)`."""
    out = ['"']
    for c in text:
        if c in _SHORT:
            out.append(_SHORT[c])
        elif c != " " and unicodedata.category(c) in _HIDDEN:
            out.append("\\u{%x}" % ord(c))
        else:
            out.append(c)
    out.append('"')
    return "".join(out)
