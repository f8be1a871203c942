"""Unit tests, run natively: `python3 -m unittest` in this directory.
`podstamp_plugin.run` goes through what the host's call does."""

import json
import sys
import unittest

sys.path.insert(0, "{{plugins}}/python")

import app  # noqa: E402
from podstamp_plugin import Error, Node, run  # noqa: E402


class Test(unittest.TestCase):
    def test_sets_the_label(self):
        node = Node("n1", architecture="arm64")
        out = run(app.transform, '{"metadata": {"name": "p"}}', node, '{"label": "cpu"}')
        self.assertEqual(json.loads(out)["metadata"]["labels"], {"cpu": "arm64"})

    def test_errors(self):
        with self.assertRaises(Error) as e:
            run(app.transform, "{}", Node("n1"), "{}")
        self.assertEqual(e.exception.message, "the host did not say the node's architecture")
        with self.assertRaises(Error) as e:
            run(app.transform, "{}", Node("n1"), '{"label": 1}')
        self.assertEqual(
            e.exception.message,
            "invalid settings at label: invalid type: integer `1`, expected a string",
        )


if __name__ == "__main__":
    unittest.main()
