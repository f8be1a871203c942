"""Native unit tests of the SDK and the example, the Rust SDK's and
substitute's own cases: `python3 -m unittest discover -s plugins/python/tests`."""

import json
import os
import sys
import unittest
from dataclasses import dataclass, field
from typing import Optional

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(here), os.path.join(os.path.dirname(here), "substitute-py")]

import app  # noqa: E402
from podstamp_plugin import (  # noqa: E402
    Error,
    FieldPath,
    Node,
    NodeAddress,
    parse_settings,
    plugin,
    quote,
    run,
    validate_settings,
)


@dataclass
class Inner:
    max_count: int = 0


@dataclass
class Settings:
    images: dict[str, str] = field(default_factory=dict)
    node_ip: Optional[str] = field(default=None, metadata={"json": "nodeIP"})
    init_containers: bool = False
    inner: Inner = field(default_factory=Inner)


def settings_error(text: str, cls=Settings) -> str:
    try:
        parse_settings(text, cls)
    except Error as e:
        assert e.field is None
        return e.message
    raise AssertionError(f"{text} parsed")


class Sdk(unittest.TestCase):
    def test_validate_settings_names_the_field_inside_the_settings(self):
        def at_most_ten(settings):
            if settings.inner.max_count > 10:
                raise Error.at(FieldPath("inner").key("maxCount"), "at most 10")

        @plugin("checked", "0.1.0", Settings, validate=at_most_ten)
        def transform(pod, node, settings):
            pass

        validate_settings(transform, "{}")
        validate_settings(transform, "")
        with self.assertRaises(Error) as e:
            validate_settings(transform, '{"images": {"amd64": 1}}')
        self.assertEqual((e.exception.field, e.exception.message), ("images.amd64", "invalid type: integer `1`, expected a string"))
        with self.assertRaises(Error) as e:
            validate_settings(transform, '{"inner": {"maxCount": 11}}')
        self.assertEqual((e.exception.field, e.exception.message), ("inner.maxCount", "at most 10"))
        with self.assertRaises(Error) as e:
            validate_settings(transform, "[")
        self.assertIsNone(e.exception.field)
        self.assertTrue(e.exception.message.startswith("invalid settings: "), e.exception.message)

    def test_paths(self):
        root = FieldPath()
        self.assertEqual(str(root.key("spec").key("containers").index(0).key("command").index(3)), "spec.containers[0].command[3]")
        self.assertEqual(str(FieldPath("metadata.labels").key("app.kubernetes.io/name")), 'metadata.labels["app.kubernetes.io/name"]')
        self.assertEqual(str(root.index(2)), "[2]")
        self.assertEqual(str(root.key("")), '[""]')
        self.assertEqual(str(root.key("x").key('say "hi"')), 'x["say \\"hi\\""]')
        self.assertEqual(str(root.key("my-key_1")), "my-key_1")

    def test_errors(self):
        self.assertEqual(str(Error.at("spec.containers[0].image", "bad")), "spec.containers[0].image: bad")
        self.assertIsNone(Error.at(FieldPath(), "root").field)
        self.assertEqual(str(Error("plain")), "plain")

    def test_quote_is_rusts_debug(self):
        self.assertEqual(quote('a"b\\c\n\t\r\0'), '"a\\"b\\\\c\\n\\t\\r\\0"')
        self.assertEqual(quote("é \u200b\u0301x"), '"é \\u{200b}\\u{301}x"')

    def test_settings(self):
        s = parse_settings('{"images": {"amd64": "a"}, "nodeIP": "X", "initContainers": true, "inner": {"maxCount": 3}}', Settings)
        self.assertEqual((s.images, s.node_ip, s.init_containers, s.inner.max_count), ({"amd64": "a"}, "X", True, 3))
        self.assertEqual(parse_settings("", Settings), Settings())
        self.assertEqual(settings_error('{"images": {"amd64": 1}}'), "invalid settings at images.amd64: invalid type: integer `1`, expected a string")
        self.assertEqual(settings_error('{"imagez": {}}'), "invalid settings at imagez: unknown field `imagez`, expected one of `images`, `nodeIP`, `initContainers`, `inner`")
        self.assertEqual(settings_error('{"inner": {"maxCount": "x"}}'), 'invalid settings at inner.maxCount: invalid type: string "x", expected i64')
        self.assertEqual(settings_error('{"initContainers": null}'), "invalid settings at initContainers: invalid type: null, expected a boolean")
        self.assertEqual(settings_error("[1]"), "invalid settings: invalid type: sequence, expected struct Settings")
        self.assertTrue(settings_error("[").startswith("invalid settings: "))
        self.assertIsNone(parse_settings(" ", None))
        self.assertEqual(settings_error('{"a": 1}', None), "invalid settings at a: unknown field `a`, there are no fields")


def node() -> Node:
    return Node(
        "n1",
        labels={"app.kubernetes.io/zone": "a"},
        annotations={"rack": "r7"},
        addresses=[NodeAddress("InternalIP", "10.0.0.12"), NodeAddress("InternalIP", "10.0.0.13")],
        architecture="arm64",
        operating_system="linux",
        kubelet_version="v1.34.2",
    )


def one(text: str) -> str:
    return app.expand(text, node(), {"region": "eu"})


class Substitute(unittest.TestCase):
    def test_placeholders(self):
        self.assertEqual(one("${node.name}-${node.arch}/${node.os}"), "n1-arm64/linux")
        self.assertEqual(one("kubelet ${node.kubeletVersion}"), "kubelet v1.34.2")
        self.assertEqual(one("${node.label[app.kubernetes.io/zone]}"), "a")
        self.assertEqual(one("${node.annotation[rack]}"), "r7")
        self.assertEqual(one("--ip=${node.address.InternalIP}"), "--ip=10.0.0.12")
        self.assertEqual(one("${var.region}${var.region}"), "eueu")
        self.assertEqual(one("$${node.name} is ${node.name}"), "${node.name} is n1")
        self.assertEqual(one("$HOME $$ $ {x} $"), "$HOME $$ $ {x} $")
        self.assertEqual(one("$${"), "${")

    def test_messages(self):
        cases = {
            "${node.nam}": 'unknown placeholder "${node.nam}"',
            "a ${node.name": 'unterminated placeholder "${node.name": no closing "}"',
            "${node.label[x]}": 'the node has no label "x" for placeholder "${node.label[x]}"',
            "${node.annotation[y]}": 'the node has no annotation "y" for placeholder "${node.annotation[y]}"',
            "${node.address.ExternalIP}": 'the node has no ExternalIP address for placeholder "${node.address.ExternalIP}"',
            "${var.zone}": 'no var "zone" in the settings for placeholder "${var.zone}"',
        }
        for text, message in cases.items():
            with self.assertRaises(ValueError) as e:
                one(text)
            self.assertEqual(str(e.exception), message)

    def test_walk(self):
        pod = {
            "metadata": {"name": "p", "labels": {"${node.name}": "${node.name}"}},
            "spec": {"containers": [{"command": ["run", "${node.name}", "${var.region}"], "ports": [{"containerPort": 80}]}]},
        }
        out = json.loads(run(app.transform, json.dumps(pod), node(), '{"vars": {"region": "eu"}}'))
        self.assertEqual(out["metadata"]["labels"], {"${node.name}": "n1"})
        self.assertEqual(out["spec"]["containers"][0]["command"], ["run", "n1", "eu"])
        self.assertEqual(out["spec"]["containers"][0]["ports"][0]["containerPort"], 80)
        # The first bad string in sorted key order, as the Rust plugin's maps.
        pod = {"spec": {"b": "${x}", "a": ["${y}"]}, "metadata": {"labels": {"app.kubernetes.io/name": "${z}"}}}
        with self.assertRaises(Error) as e:
            run(app.transform, json.dumps(pod), node(), "{}")
        self.assertEqual(e.exception.field, 'metadata.labels["app.kubernetes.io/name"]')


if __name__ == "__main__":
    unittest.main()
