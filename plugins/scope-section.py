#!/usr/bin/env python3
"""Writes a plugin's scope declaration into its built component.

The Rust SDK's `podstamp_plugin::scope!` puts the declaration in the
component at compile time; componentize-py and componentize-js cannot, so
the Python and JavaScript build scripts (plugins/python/build.sh,
plugins/js/build.mjs) run this on the component they made:

  python3 plugins/scope-section.py COMPONENT.wasm [GRANT ...]
      declares these grants (none: the plugin changes nothing)
  python3 plugins/scope-section.py COMPONENT.wasm --from-python APP.py
      declares the grants of APP.py's module-level `PODSTAMP_SCOPE`, a
      list or tuple of string literals; without one, writes nothing (the
      plugin declares nothing)
  python3 plugins/scope-section.py --check-python APP.py
  python3 plugins/scope-section.py --check WHERE [GRANT ...]
      only check APP.py's declaration, or these grants (WHERE names where
      they are declared, for the error); run before the long componentize,
      so that a bad one fails fast

A declaration that is not a list of grants, or a grant that is empty, has
surrounding blanks or a line break, is refused with one line naming the
file and the field, and nothing is written.

The declaration is the custom section `podstamp:scope` that the host reads
(host/src/plugin/declared.rs): the line `podstamp-scope 1`, then one grant a
line, in UTF-8. It is appended after the component's last top-level section
(a custom section is id 0, the LEB128 size, the LEB128 name length, the
name, the payload), so nothing else in the component changes. COMPONENT is
rewritten in place, atomically; a component that already declares a scope
is refused (the host would read only the first declaration).

Needs only python3 (3.8 or newer), no package.
"""

import ast
import os
import sys

SECTION = b"podstamp:scope"
HEADER = "podstamp-scope 1"


def fail(message):
    print(f"scope-section.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def leb128(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_leb128(data, at):
    value, shift = 0, 0
    while shift < 35:
        if at >= len(data):
            return None, at
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    return None, at


def declares(data, depth=0):
    """Whether the module or component `data`, or one nested in it, already
    has the section: walked as the host walks it (section headers only)."""
    if depth > 16 or data[:4] != b"\0asm" or len(data) < 8:
        return False
    component = data[6:8] == b"\x01\x00"
    at = 8
    while at < len(data):
        section_id = data[at]
        size, at = read_leb128(data, at + 1)
        if size is None or at + size > len(data):
            return False
        payload = data[at : at + size]
        at += size
        if section_id == 0:
            length, name_at = read_leb128(payload, 0)
            if length is not None and payload[name_at : name_at + length] == SECTION:
                return True
        elif section_id in (1, 4) and component and declares(payload, depth + 1):
            return True
    return False


def grants_of_python(app):
    """The strings of `PODSTAMP_SCOPE = [...]` at the top of the module
    `app`; None when it has none."""
    try:
        with open(app, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=app)
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        fail(f"cannot read {app}: {e}")
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "PODSTAMP_SCOPE" for t in targets):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            value = None
        if not isinstance(value, (list, tuple)) or not all(isinstance(g, str) for g in value):
            fail(
                f"{app}:{node.lineno}: PODSTAMP_SCOPE must be a list of string literals, "
                'e.g. PODSTAMP_SCOPE = ["spec.containers[*].env"] ([] declares that the plugin changes nothing)'
            )
        found = list(value)
    return found


def check(where, grants):
    for grant in grants:
        # One grant a line: a line break or surrounding blanks would make the
        # host read another grant than the one written.
        if grant == "" or grant != grant.strip() or "\n" in grant or "\r" in grant:
            fail(
                f"{where}: grant {grant!r} is not a field path: "
                "write it as in a catalog entry's scope:, e.g. spec.containers[*].env"
            )


def main(argv):
    if argv[:1] == ["--check-python"]:
        if len(argv) != 2:
            fail("usage: scope-section.py --check-python APP.py")
        check(f"{argv[1]}: PODSTAMP_SCOPE", grants_of_python(argv[1]) or [])
        return
    if argv[:1] == ["--check"]:
        if len(argv) < 2:
            fail("usage: scope-section.py --check WHERE [GRANT ...]")
        check(argv[1], argv[2:])
        return
    if len(argv) < 1 or argv[0].startswith("-"):
        fail("usage: scope-section.py COMPONENT.wasm [GRANT ...] | COMPONENT.wasm --from-python APP.py")
    component, rest = argv[0], argv[1:]
    if rest[:1] == ["--from-python"]:
        if len(rest) != 2:
            fail("usage: scope-section.py COMPONENT.wasm --from-python APP.py")
        grants = grants_of_python(rest[1])
        if grants is None:
            return
        where = f"{rest[1]}: PODSTAMP_SCOPE"
    else:
        grants = rest
        where = "the declared scope"
    check(where, grants)
    try:
        with open(component, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"cannot read {component}: {e}")
    if data[:4] != b"\0asm" or data[6:8] != b"\x01\x00":
        fail(f"{component} is not a WebAssembly component")
    if declares(data):
        fail(f"{component} already declares a scope (a {SECTION.decode()} section): declare it once")
    text = "".join(f"{line}\n" for line in [HEADER, *grants]).encode("utf-8")
    payload = leb128(len(SECTION)) + SECTION + text
    section = b"\0" + leb128(len(payload)) + payload
    tmp = f"{component}.scope.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data + section)
        os.replace(tmp, component)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        fail(f"cannot write {component}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
