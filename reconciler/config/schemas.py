"""The rules an interface's tools.json must keep (design §5: S2, S4, S5, S6, annotations).

Runs on one tools.json at a time, so its findings are cached with the file's content. Schemas are
checked against the Draft 2020-12 meta-schema with `jsonschema`, whose messages are the clearest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from reconciler.config.findings import Finding
from reconciler.config.lines import KeyPath
from reconciler.config.models import Tool
from reconciler.config.parsing import Document, model_finding

__all__ = ["FILE_FORMATS", "check_tools", "iter_subschemas"]

FILE_FORMATS = frozenset({"handler-file", "handler-output-file"})
_META = Draft202012Validator(Draft202012Validator.META_SCHEMA)
_FLAG = re.compile(r"^(supports?|has|can|capabilit|feature|enable)[_A-Z-]?", re.IGNORECASE)
_FLAG_NAMES = frozenset({"capabilities", "features", "supports"})
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
_DRAFT7_EQUIVALENT = {
    "prefixItems": 'use "items": [...] tuple form or an object instead of a positional array',
    "dependentRequired": 'use "dependencies": {"a": ["b"]}',
    "dependentSchemas": 'use "dependencies": {"a": {...}}',
    "unevaluatedProperties": 'close the object with "additionalProperties": false',
}
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


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        return True
    return kind is None and "properties" in schema


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()


def check_tools(doc: Document, value: Any, interface: str) -> tuple[list[Tool], list[Finding]]:
    """Validate a tools.json payload for interface `interface`; return its tools and every finding."""
    findings: list[Finding] = []
    if not isinstance(value, list):
        findings.append(
            Finding(
                "F004",
                doc.path,
                1,
                "tools.json is not a list of tools",
                "a JSON array of MCP tools, as a tools/list result's 'tools'",
                'wrap the tools in [ ... ]; each is {"name", "description", "inputSchema", ...}',
            )
        )
        return [], findings
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    prefix = interface.replace("-", "_") + "_"
    for index, raw in enumerate(value):
        try:
            tool = Tool.model_validate(raw)
        except ValidationError as exc:
            findings.extend(
                model_finding(doc, {**e, "loc": (index, *e["loc"])}, set(Tool.model_fields)) for e in exc.errors()
            )
            continue
        name_at = (index, "name")  # lines are looked up only for findings: scanning costs more than parsing
        if tool.name in seen:
            findings.append(
                Finding(
                    "I012",
                    doc.path,
                    doc.line_of(*name_at),
                    f"tool '{tool.name}' is defined twice (first at line {doc.line_of(seen[tool.name], 'name')})",
                    "unique tool names",
                    "rename or remove one of them",
                )
            )
        seen.setdefault(tool.name, index)
        if not tool.name.startswith(prefix):
            findings.append(
                Finding(
                    "I007",
                    doc.path,
                    doc.line_of(*name_at),
                    f"tool '{tool.name}' does not start with '{prefix}'",
                    f"a name of the form {prefix}<verb> (S5: tools never collide across interfaces)",
                    f'"name": "{prefix}{tool.name.split("_")[-1]}"',
                )
            )
        findings.extend(_check_annotations(doc, index, tool))
        findings.extend(_check_schema(doc, (index, "inputSchema"), tool.inputSchema, tool.name, required=True))
        if tool.outputSchema is None:
            findings.append(
                Finding(
                    "F004",
                    doc.path,
                    doc.line_of(*name_at),
                    f"tool '{tool.name}' has no outputSchema",
                    "an outputSchema, so every result can be validated (S2)",
                    '"outputSchema": {"type": "object", "additionalProperties": false, ...}',
                )
            )
        else:
            findings.extend(_check_schema(doc, (index, "outputSchema"), tool.outputSchema, tool.name, required=True))
        tools.append(tool)
    return tools, findings


def _check_annotations(doc: Document, index: int, tool: Tool) -> list[Finding]:
    hints = tool.annotations
    if hints.readOnlyHint is None:
        return [
            Finding(
                "I011",
                doc.path,
                doc.line_of(index, "annotations"),
                f"tool '{tool.name}' does not state annotations.readOnlyHint",
                "readOnlyHint true (a read) or false (a write or destructive action)",
                '"annotations": {"readOnlyHint": true}',
            )
        ]
    if hints.readOnlyHint is False and hints.destructiveHint is None:
        return [
            Finding(
                "I011",
                doc.path,
                doc.line_of(index, "annotations"),
                f"tool '{tool.name}' is not read-only but does not state annotations.destructiveHint",
                "destructiveHint true (destructive) or false (a write)",
                '"annotations": {"readOnlyHint": false, "destructiveHint": false}',
            )
        ]
    return []


def _check_schema(doc: Document, at: KeyPath, schema: dict[str, Any], tool: str, *, required: bool) -> list[Finding]:
    findings: list[Finding] = []
    # The compiled meta-schema answers yes/no fast; jsonschema then words the errors of a bad schema.
    errors = [] if jsonschema_rs.meta.is_valid(schema) else list(_META.iter_errors(schema))
    for err in errors:
        where = (*at, *err.absolute_path)
        findings.append(
            Finding(
                "I002",
                doc.path,
                doc.line_of(*where),
                f"tool '{tool}' {at[-1]} is not valid JSON "
                f"Schema 2020-12 at '{'/'.join(map(str, err.absolute_path)) or '(root)'}': "
                f"{err.message}",
                "a schema valid against the Draft 2020-12 meta-schema",
                "correct the keyword's value (see json-schema.org/draft/2020-12)",
            )
        )
    if findings:
        return findings
    if required and schema.get("type") != "object":
        findings.append(
            Finding(
                "F004",
                doc.path,
                doc.line_of(*at),
                f"tool '{tool}' {at[-1]} is not an object schema",
                '"type": "object" at its root, as MCP requires',
                'add "type": "object"',
            )
        )
    for sub_path, sub in iter_subschemas(schema):
        where = (*at, *sub_path)
        shown = "/".join(map(str, sub_path)) or "(root)"
        if _is_object(sub) and sub.get("additionalProperties") is not False:
            findings.append(
                Finding(
                    "I001",
                    doc.path,
                    doc.line_of(*where),
                    f"tool '{tool}' {at[-1]}: the object at '{shown}' does not close its properties (S2)",
                    '"additionalProperties": false on every object schema, nested and in $defs',
                    'add "additionalProperties": false',
                )
            )
        fmt = sub.get("format")
        if fmt in FILE_FORMATS and _types(sub) != {"string"}:
            findings.append(
                Finding(
                    "I006",
                    doc.path,
                    doc.line_of(*where),
                    f"tool '{tool}' {at[-1]}: format '{fmt}' at '{shown}' is on a property that is not a string (S4)",
                    f'"type": "string" beside "format": "{fmt}"',
                    'make the property {"type": "string", "format": ...}',
                )
            )
        for keyword in sorted(NEW_KEYWORDS.intersection(sub)):
            findings.append(
                Finding(
                    "I015",
                    doc.path,
                    doc.line_of(*where, keyword),
                    f"tool '{tool}' {at[-1]}: '{keyword}' at '{shown}' is a 2020-12 keyword the conformance fuzzer "
                    "(hypothesis-jsonschema, drafts 4-7) cannot honour; its generated inputs ignore it",
                    "keywords of drafts 4-7 where an equivalent exists",
                    _DRAFT7_EQUIVALENT.get(keyword, "keep it if needed: the conformance report lists it as not fuzzed"),
                )
            )
        for name, prop in (sub.get("properties") or {}).items():
            if isinstance(prop, dict) and (
                name.lower() in _FLAG_NAMES or (_FLAG.match(name) and _types(prop) == {"boolean"})
            ):
                findings.append(
                    Finding(
                        "I008",
                        doc.path,
                        doc.line_of(*where, "properties", name),
                        f"tool '{tool}' {at[-1]}: '{name}' looks like a feature flag (S6)",
                        "no optional capabilities: a field every connector fills, or another interface",
                        f"remove '{name}'; make the data it guards optional instead",
                    )
                )
        ref = sub.get("$ref")
        if isinstance(ref, str) and _resolve_ref(schema, ref) is None:
            findings.append(
                Finding(
                    "I003",
                    doc.path,
                    doc.line_of(*where, "$ref"),
                    f"tool '{tool}' {at[-1]}: $ref '{ref}' does not resolve",
                    "a reference inside the same schema, like '#/$defs/<name>'",
                    "define the target under $defs or correct the reference",
                )
            )
    return findings


def _resolve_ref(schema: dict[str, Any], ref: str) -> Any:
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
