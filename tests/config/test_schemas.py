"""How deep the values a JSON Schema allows nest (`schemas.schema_depth`): the router measures an output per call
only when its outputSchema sets no bound, so a closed schema costs nothing a call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.config.schemas import schema_depth

_TEXT = {"type": "string"}
_NODE = {"type": "object", "additionalProperties": False, "properties": {"c": {"$ref": "#/$defs/node"}}}


@pytest.mark.parametrize(("schema", "depth"), [
    (_TEXT, 0),
    ({"type": "object", "additionalProperties": False, "properties": {"text": _TEXT}}, 1),
    ({"type": "object", "additionalProperties": False, "properties": {
        "pages": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                             "properties": {"words": {"type": "array", "items": _TEXT}}}}}}, 4),
    ({"enum": [{"a": [1]}, "x"]}, 2),
    ({"anyOf": [_TEXT, {"type": "array", "items": _TEXT}]}, 1),
    ({"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}}}, 2),
    ({"type": "object"}, None),  # open to any value
    ({"type": "object", "additionalProperties": False, "properties": {"x": {}}}, None),  # `{}`: anything
    ({"type": "array"}, None),  # items of any kind
    ({"$defs": {"node": _NODE}, **_NODE}, None),  # recursive
    ({"$ref": "other.json#/x"}, None),  # a schema elsewhere
    ({"not": _TEXT}, None),
])
def test_a_schema_sets_the_depth_of_its_values_or_no_bound(schema: dict[str, Any], depth: int | None) -> None:
    assert schema_depth(schema) == depth


# Outputs no schema can bound: llm/v2's tool calls carry the arguments the model chose, any JSON object. The router
# measures their depth on each call (microseconds, beside a model's seconds).
UNBOUNDED = {("llm", "llm_chat")}


def test_every_shipped_interface_bounds_its_outputs() -> None:
    """So no shipped tool pays for measuring its output's depth on a call, but those that cannot."""
    root = Path(__file__).resolve().parents[2] / "catalog/interfaces"
    depths = {(f.parent.parent.name, t["name"]): schema_depth(t["outputSchema"])
              for f in root.glob("*/v*/tools.json") for t in json.loads(f.read_text())}
    assert depths
    assert all(d is not None and d <= 16 for key, d in depths.items() if key not in UNBOUNDED), depths
    assert all(depths[key] is None for key in UNBOUNDED)
