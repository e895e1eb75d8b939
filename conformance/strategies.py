"""Valid inputs for a tool: hypothesis strategies drawn from its `inputSchema`.

`valid_inputs` builds a strategy for arguments valid against a schema. Closed objects (the rule S2
makes every object one) and plain arrays are drawn with hypothesis's own `fixed_dictionaries` and
`lists`, a few times faster per example than hypothesis-jsonschema's general object strategy; every
other subschema is hypothesis-jsonschema's (`from_schema`). `handler-file` values are drawn from the
interface's fixture files and `handler-output-file` values are fresh paths in the work folder.
Bounded texts get lengths spread over their range, up to 1 KiB into it (hypothesis alone draws a few
characters almost always, so a connector that fails on long inputs would rarely be seen); arrays get
at most 16 items (or their minItems). Inputs past those sizes are not generated. Only inputs the router's
own validator (jsonschema-rs, 2020-12) accepts, and a JSON-RPC line can carry (integers within 64 bits, which
an open value may otherwise draw), are kept.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from hypothesis import strategies as st
from hypothesis.provisional import domains
from hypothesis_jsonschema import from_schema

from reconciler.config.formats import compile_validator

__all__ = ["INPUT_FORMAT", "OUTPUT_FOLDER", "OUTPUT_FORMAT", "NoFixturesError", "valid_inputs"]

OUTPUT_FOLDER = "conformance-out"
INPUT_FORMAT, OUTPUT_FORMAT = "handler-file", "handler-output-file"
_SHORT = 64  # half the texts are at most this long: where failures shrink to
_LONG = 1024  # the other half reach up to this far into the range (hypothesis's sizes stay practical)
_ITEMS = 16  # arrays are drawn with at most this many items (or minItems): past it, a draw costs, finds little
_PLAIN_OBJECT = frozenset({"type", "properties", "required", "additionalProperties", "description", "title",
                           "$comment", "examples", "$defs", "definitions", "$schema"})
_PLAIN_ARRAY = frozenset({"type", "items", "minItems", "maxItems", "uniqueItems", "description", "title", "$comment",
                          "examples"})
_ANNOTATIONS = frozenset({"description", "title", "$comment", "examples"})


class NoFixturesError(Exception):
    """A tool takes a `handler-file` but its interface version ships no fixture file to draw one from."""


def valid_inputs(schema: Mapping[str, Any], fixtures: Sequence[str],
                 addresses: Sequence[str] = ()) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments valid against `schema`, drawing files from `fixtures` (paths in the work folder) and,
    when given, half the `format: uri` values from `addresses` (the URLs the interface's cases call the
    tool with, which the check's pages answer), so a fetcher gets outputs as well as errors."""
    if _uses_format(schema, INPUT_FORMAT) and not fixtures:
        raise NoFixturesError("the tool takes a handler-file, but its interface version's conformance/ folder holds "
                              "no fixture file to draw one from")
    formats: dict[str, st.SearchStrategy[str]] = {
        INPUT_FORMAT: st.sampled_from(sorted(fixtures)) if fixtures else st.just("missing"),
        OUTPUT_FORMAT: st.integers(0, 2**32 - 1).map(lambda n: f"{OUTPUT_FOLDER}/{n:08x}"),
    }
    if addresses:  # the other half as hypothesis-jsonschema draws a uri: an https address on some domain
        formats["uri"] = st.sampled_from(sorted(addresses)) | domains().map("https://{}".format)
    root = {k: v for k, v in schema.items() if k != "$schema"}
    strategy: st.SearchStrategy[dict[str, Any]] = _Builder(root, formats).build(root)
    # hypothesis-jsonschema reads drafts 4-7, and Python's `$` also matches before a final newline:
    # keep only what the router's validator accepts.
    return strategy.filter(compile_validator(schema).is_valid).filter(_carried)


def _carried(arguments: dict[str, Any]) -> bool:
    """Whether one JSON-RPC line can carry `arguments`: the router's parser, orjson, holds integers to 64 bits."""
    try:
        orjson.dumps(arguments)
    except orjson.JSONEncodeError:
        return False
    return True


class _Builder:
    def __init__(self, root: dict[str, Any], formats: dict[str, st.SearchStrategy[str]]) -> None:
        self.root = root
        self.formats = formats
        self.defs = {k: root[k] for k in ("$defs", "definitions") if k in root}

    def build(self, node: Any, depth: int = 0) -> st.SearchStrategy[Any]:
        node = self.resolve(node)
        if not isinstance(node, dict) or depth > 20:
            return self.general(node)
        kind = node.get("type")
        if kind == "object" and node.keys() <= _PLAIN_OBJECT and node.get("additionalProperties") is False:
            props: dict[str, Any] = node.get("properties") or {}
            required = [k for k in node.get("required") or () if k in props]
            if len(required) == len(node.get("required") or ()):
                return st.fixed_dictionaries(
                    {k: self.build(props[k], depth + 1) for k in required},
                    optional={k: self.build(v, depth + 1) for k, v in props.items() if k not in required})
        if kind == "array" and node.keys() <= _PLAIN_ARRAY and isinstance(node.get("items"), dict):
            unique = _canonical if node.get("uniqueItems") is True else None
            low, high = node.get("minItems", 0), node.get("maxItems")
            most = max(low, _ITEMS) if high is None else min(high, max(low, _ITEMS))
            return st.lists(self.build(node["items"], depth + 1), min_size=low, max_size=most, unique_by=unique)
        if kind == "string" and node.get("format") in self.formats and node.keys() <= _ANNOTATIONS | {"type", "format"}:
            return self.formats[node["format"]]
        low, high = node.get("minLength", 0), node.get("maxLength")
        if kind == "string" and node.keys() <= _ANNOTATIONS | {"type", "minLength", "maxLength"} \
                and isinstance(low, int) and isinstance(high, int) and high > low:
            return st.one_of(st.integers(low, min(high, low + _SHORT)), st.integers(low, min(high, low + _LONG))) \
                .flatmap(_text_of_length)
        return self.general(node)

    def general(self, node: Any) -> st.SearchStrategy[Any]:
        """hypothesis-jsonschema's strategy for `node`, with the root's definitions for its `$ref`s."""
        if isinstance(node, dict) and _has_ref(node):
            node = {**self.defs, **node}
        return from_schema(node, custom_formats=self.formats)

    def resolve(self, node: Any, depth: int = 0) -> Any:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/") or depth > 20 or set(node) - {"$ref"} - _ANNOTATIONS:
            return node
        target: Any = self.root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        return self.resolve(target, depth + 1) if isinstance(target, dict) else node


@functools.lru_cache(maxsize=4096)
def _text_of_length(n: int) -> st.SearchStrategy[str]:
    return st.text(min_size=n, max_size=n)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _has_ref(node: Any) -> bool:
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_ref(v) for v in node)
    return False


def _uses_format(schema: Mapping[str, Any], fmt: str) -> bool:
    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("format") == fmt or any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False

    return walk(schema)
