"""What the save-time checks and the conformance fuzzer both know about JSON Schema 2020-12.

Walking every subschema of a schema, the keywords schema-driven fuzzing cannot honour, the file
formats of the handler, resolving a local `$ref`, how deep the values a schema allows may nest (the
router's bound on outputs), and where a schema breaks the 2020-12 meta-schema (which the built-in llm
also asks of the tools a call offers its model). The rules themselves are in `checks.tools`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from reconciler.config.lines import KeyPath

__all__ = ["FILE_FORMATS", "NEW_KEYWORDS", "is_object_schema", "iter_subschemas", "resolve_ref", "schema_depth",
           "schema_errors", "types_of"]

_META = Draft202012Validator(Draft202012Validator.META_SCHEMA)

FILE_FORMATS = frozenset({"handler-file", "handler-output-file"})
# Keywords of 2020-12 (and 2019-09) that schema-driven generators for drafts 4-7 cannot honour.
NEW_KEYWORDS = frozenset(
    {
        "prefixItems",
        "unevaluatedProperties",
        "unevaluatedItems",
        "dependentSchemas",
        "dependentRequired",
        "$dynamicRef",
        "$dynamicAnchor",
        "minContains",
        "maxContains",
        "$recursiveRef",
    }
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "additionalProperties",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)


def iter_subschemas(schema: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, dict[str, Any]]]:
    """Every schema object inside `schema`, itself included, with its path."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key in _SCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, dict):
            for name, inner in sub.items():
                yield from iter_subschemas(inner, (*path, key, name))
    for key in _SCHEMA_LISTS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, inner in enumerate(sub):
                yield from iter_subschemas(inner, (*path, key, i))
    for key in _SCHEMA_ONE:
        sub = schema.get(key)
        if isinstance(sub, list):  # draft-4 style tuple items
            for i, inner in enumerate(sub):
                yield from iter_subschemas(inner, (*path, key, i))
        else:
            yield from iter_subschemas(sub, (*path, key))


def is_object_schema(schema: dict[str, Any]) -> bool:
    """True when `schema` describes an object: typed so, or untyped with properties."""
    kind = schema.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        return True
    return kind is None and "properties" in schema


def types_of(schema: dict[str, Any]) -> set[str]:
    """The types `schema` names ("type": "string" or a list of them); empty when it names none."""
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()


def resolve_ref(schema: dict[str, Any], ref: str) -> Any:
    """What a local `$ref` ('#/$defs/x') points to inside `schema`, or None when it points nowhere."""
    if not ref.startswith("#"):
        return None  # schemas are self-contained: nothing is fetched
    node: Any = schema
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


_LEAF_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})


def schema_depth(schema: Any, root: Any = None, refs: frozenset[str] = frozenset()) -> int | None:
    """How deep the values `schema` allows nest objects and arrays (an object of strings: 1), or None when it sets
    no bound: a recursive `$ref`, an object open to any value, an array of anything, no type at all. `root` is the
    schema its local `$ref`s point into (itself by default)."""
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return 0 if schema is False else None  # `true` (or no schema): anything
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return max(map(_value_depth, values), default=0) if isinstance(values, list) else None
    depths: list[int | None] = [schema_depth(branch, root, refs) for key in ("anyOf", "oneOf", "allOf")
                                for branch in schema.get(key) or ()]
    ref = schema.get("$ref")
    if isinstance(ref, str):  # a cycle, or a schema elsewhere, sets no bound
        depths.append(None if ref in refs else schema_depth(resolve_ref(root, ref), root, refs | {ref}))
    kinds = types_of(schema)
    if kinds & {"object", "array"}:
        depths.append(_container_depth(schema, kinds, root, refs))
    elif not kinds <= _LEAF_TYPES or not (kinds or depths):
        depths.append(None)  # a type this does not know, or none: any value
    return None if None in depths else max((d for d in depths if d is not None), default=0)


def _container_depth(schema: dict[str, Any], kinds: set[str], root: Any, refs: frozenset[str]) -> int | None:
    inner: list[int | None] = []
    if "object" in kinds:
        extra = schema.get("additionalProperties", True)
        inner += [schema_depth(sub, root, refs) for sub in (schema.get("properties") or {}).values()]
        inner += [schema_depth(sub, root, refs) for sub in (schema.get("patternProperties") or {}).values()]
        inner.append(0 if extra is False else schema_depth(extra, root, refs))
    if "array" in kinds:
        inner += [schema_depth(sub, root, refs) for sub in schema.get("prefixItems") or ()]
        inner.append(schema_depth(schema.get("items", True), root, refs))
    return None if None in inner else 1 + max((d for d in inner if d is not None), default=0)


def _value_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_value_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_value_depth, value), default=0)
    return 0


def schema_errors(schema: Any) -> list[ValidationError]:
    """Where `schema` breaks the Draft 2020-12 meta-schema; empty when it is valid. The compiled meta-schema
    answers yes or no fast; only an invalid schema is walked again by `jsonschema`, whose messages are the clearest."""
    return [] if jsonschema_rs.meta.is_valid(schema) else list(_META.iter_errors(schema))
