"""A small config tree around the shout connector, for the conformance runner's tests and benchmark.

It holds the interface `shout/v1` (two tools: `shout_text`, and `shout_file` taking a handler-file,
three cases and one fixture file), the connector `shout` running `shout_connector.py` with this
Python, and one binding per behaviour of the connector (`shout-good`, `shout-extra-field`,
`shout-bad-code`, `shout-crash-non-ascii`, `shout-hang-long`). The test of the hanging connector
gives a short time limit, which keeps its shrinking quick.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

CONNECTOR = Path(__file__).with_name("shout_connector.py")
MODES = ("good", "extra_field", "bad_code", "crash_non_ascii", "hang_long")

_OUTPUT = {"type": "object", "additionalProperties": False, "required": ["text", "length"],
           "properties": {"text": {"type": "string"}, "length": {"type": "integer", "minimum": 0}}}
TOOLS: list[dict[str, Any]] = [
    {
        "name": "shout_text",
        "description": "Shout a text back in upper case, once or a few times.",
        "inputSchema": {"type": "object", "additionalProperties": False, "required": ["text"],
                        "properties": {"text": {"type": "string", "maxLength": 200},
                                       "times": {"type": "integer", "minimum": 1, "maximum": 3}}},
        "outputSchema": _OUTPUT,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "shout_file",
        "description": "Shout the text of a file of the work folder.",
        "inputSchema": {"type": "object", "additionalProperties": False, "required": ["path"],
                        "properties": {"path": {"type": "string", "format": "handler-file"}}},
        "outputSchema": _OUTPUT,
        "annotations": {"readOnlyHint": True},
    },
]

CASES = '''[[case]]
name = "shouts"
tool = "shout_text"
input = { text = "hello" }
expect.text.contains = "HELLO"
expect.length.minimum = 5

[[case]]
name = "nothing to shout"
tool = "shout_text"
input = { text = "" }
expect.error = "empty_text"

[[case]]
name = "reads a file"
tool = "shout_file"
input = { path = "hello.txt" }
expect.contains = ["HELLO FROM A FILE"]
expect.length.equals = 17
'''


def binding_name(mode: str) -> str:
    return "shout-" + mode.replace("_", "-")


def write_shout_tree(root: Path, *, timeout: float = 5.0, count: bool = False,
                     cases: str = CASES, tools: list[dict[str, Any]] | None = None) -> Path:
    """Write the tree under `root` (created) and return it."""
    iface = root / "catalog/interfaces/shout/v1"
    (iface / "conformance").mkdir(parents=True)
    (iface / "interface.toml").write_text(
        'apiVersion = "handler.interface/v1"\nname = "shout"\nversion = 1\n'
        'description = "Shout texts back, for testing the conformance runner"\n\n'
        f'[limits]\nmaxFileBytes = 10000\ntimeoutSeconds = {timeout}\n\n'
        '[errors]\nunavailable = "the shouter is down"\nempty_text = "there was nothing to shout"\n')
    (iface / "tools.json").write_text(json.dumps(tools if tools is not None else TOOLS, indent=2))
    (iface / "conformance/cases.toml").write_text(cases)
    (iface / "skills/shout").mkdir(parents=True)
    (iface / "skills/shout/SKILL.md").write_text("---\nname: shout\ndescription: Shout a text back in capitals with "
                                                 "shout_text.\n---\n\n# Shout\n")
    (iface / "conformance/hello.txt").write_text("hello from a file")
    conn = root / "catalog/connectors/shout"
    conn.mkdir(parents=True)
    (conn / "connector.toml").write_text(
        'apiVersion = "handler.connector/v1"\nname = "shout"\ndescription = "Shouts, for tests"\n'
        'implements = ["shout/v1"]\negress = []\n\n'
        '[settings.mode]\nenv = "SHOUT_MODE"\ndefault = "good"\ndescription = "how to (mis)behave"\n\n'
        '[settings.count]\nenv = "SHOUT_COUNT"\ndefault = "no"\n'
        'description = "yes: a stderr line per call received"\n\n'
        f'[run]\ncommand = {json.dumps([sys.executable, "main.py"])}\ntransport = "stdio"\n')
    shutil.copy(CONNECTOR, conn / "main.py")  # a connector's code lives in its folder: all its sandbox shows of it
    (conn / "PROVISIONING.md").write_text("# shout\n\nNothing to provision: it runs with the test Python.\n")
    bindings = root / "config/bindings"
    bindings.mkdir(parents=True)
    for mode in MODES:
        counted = ', count = "yes"' if count else ""
        name = binding_name(mode)
        (bindings / f"{name}.toml").write_text(
            f'apiVersion = "handler.binding/v1"\nname = "{name}"\nconnector = "shout"\n'
            f'description = "The shout connector, {mode}"\nsettings = {{ mode = "{mode}"{counted} }}\n')
    return root
