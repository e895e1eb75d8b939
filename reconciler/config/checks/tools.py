"""What a tool's schemas show: the rules an interface's tools.json must keep (docs/architecture.md §5).

Tool names carry the interface's name (S5) and are unique; each tool states its action class in
its annotations; its input and output schemas are valid 2020-12 (checked with the compiled
meta-schema, worded by `jsonschema`, whose messages are the clearest), closed (S2), with files as
strings (S4) and no feature flags (S6). Runs on one tools.json at a time, so the loader caches its
findings with the file's content. F004, I001-I003, I006-I008, I011, I012, I015.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from reconciler.config.checks.syntax import model_findings
from reconciler.config.documents import Document
from reconciler.config.findings import Finding
from reconciler.config.lines import KeyPath
from reconciler.config.models import Tool
from reconciler.config.schemas import (
    FILE_FORMATS,
    NEW_KEYWORDS,
    is_object_schema,
    iter_subschemas,
    resolve_ref,
    schema_errors,
    types_of,
)

__all__ = ["check_tools"]

_FLAG = re.compile(r"^(supports?|has|can|capabilit|feature|enable)[_A-Z-]?", re.IGNORECASE)
_FLAG_NAMES = frozenset({"capabilities", "features", "supports"})
_DRAFT7_EQUIVALENT = {
    "prefixItems": 'use "items": [...] tuple form or an object instead of a positional array',
    "dependentRequired": 'use "dependencies": {"a": ["b"]}',
    "dependentSchemas": 'use "dependencies": {"a": {...}}',
    "unevaluatedProperties": 'close the object with "additionalProperties": false',
}


def check_tools(doc: Document, value: Any, interface: str) -> tuple[list[Tool], list[Finding]]:
    """Validate a tools.json payload for interface `interface`; return its tools and every finding."""
    if not isinstance(value, list):
        return [], [
            Finding(
                "F004",
                doc.path,
                1,
                "tools.json is not a list of tools",
                "a JSON array of MCP tools, as a tools/list result's 'tools'",
                'wrap the tools in [ ... ]; each is {"name", "description", "inputSchema", ...}',
            )
        ]
    findings: list[Finding] = []
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    prefix = interface.replace("-", "_") + "_"
    for index, raw in enumerate(value):
        try:
            tool = Tool.model_validate(raw)
        except ValidationError as exc:
            known = set(Tool.model_fields)
            findings.extend(model_findings(doc, value, [{**e, "loc": (index, *e["loc"])} for e in exc.errors()], known))
            continue
        findings.extend(_check_name(doc, index, tool, prefix, seen))
        seen.setdefault(tool.name, index)
        findings.extend(_check_annotations(doc, index, tool))
        findings.extend(_check_schemas(doc, index, tool))
        tools.append(tool)
    return tools, findings


def _check_name(doc: Document, index: int, tool: Tool, prefix: str, seen: dict[str, int]) -> Iterator[Finding]:
    """I012 when an earlier tool (in `seen`, name → index) has the same name; I007 without the prefix (S5)."""
    name_at = (index, "name")  # lines are looked up only for findings: scanning costs more than parsing
    if tool.name in seen:
        yield Finding(
            "I012",
            doc.path,
            doc.line_of(*name_at),
            f"tool '{tool.name}' is defined twice (first at line {doc.line_of(seen[tool.name], 'name')})",
            "unique tool names",
            "rename or remove one of them",
        )
    if not tool.name.startswith(prefix):
        yield Finding(
            "I007",
            doc.path,
            doc.line_of(*name_at),
            f"tool '{tool.name}' does not start with '{prefix}'",
            f"a name of the form {prefix}<verb> (S5: tools never collide across interfaces)",
            f'"name": "{prefix}{tool.name.split("_")[-1]}"',
        )


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


def _check_schemas(doc: Document, index: int, tool: Tool) -> list[Finding]:
    """The tool's inputSchema and its outputSchema, which every tool must have (S2)."""
    findings = _check_schema(doc, (index, "inputSchema"), tool.inputSchema, tool.name)
    if tool.outputSchema is None:
        findings.append(
            Finding(
                "F004",
                doc.path,
                doc.line_of(index, "name"),
                f"tool '{tool.name}' has no outputSchema",
                "an outputSchema, so every result can be validated (S2)",
                '"outputSchema": {"type": "object", "additionalProperties": false, ...}',
            )
        )
    else:
        findings.extend(_check_schema(doc, (index, "outputSchema"), tool.outputSchema, tool.name))
    return findings


def _check_schema(doc: Document, at: KeyPath, schema: dict[str, Any], tool: str) -> list[Finding]:
    """One schema at `at`: valid 2020-12 first (nothing more is said of an invalid one), then its rules."""
    findings = _check_meta(doc, at, schema, tool)
    if findings:
        return findings
    if schema.get("type") != "object":
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
        findings.extend(_check_subschema(doc, at, tool, sub_path, sub))
        ref = sub.get("$ref")
        if isinstance(ref, str) and resolve_ref(schema, ref) is None:
            findings.append(
                Finding(
                    "I003",
                    doc.path,
                    doc.line_of(*at, *sub_path, "$ref"),
                    f"tool '{tool}' {at[-1]}: $ref '{ref}' does not resolve",
                    "a reference inside the same schema, like '#/$defs/<name>'",
                    "define the target under $defs or correct the reference",
                )
            )
    return findings


def _check_meta(doc: Document, at: KeyPath, schema: dict[str, Any], tool: str) -> list[Finding]:
    return [
        Finding(
            "I002",
            doc.path,
            doc.line_of(*at, *err.absolute_path),
            f"tool '{tool}' {at[-1]} is not valid JSON "
            f"Schema 2020-12 at '{'/'.join(map(str, err.absolute_path)) or '(root)'}': "
            f"{err.message}",
            "a schema valid against the Draft 2020-12 meta-schema",
            "correct the keyword's value (see json-schema.org/draft/2020-12)",
        )
        for err in schema_errors(schema)
    ]


def _check_subschema(
    doc: Document, at: KeyPath, tool: str, sub_path: KeyPath, sub: dict[str, Any]
) -> Iterator[Finding]:
    """The rules every object inside a schema keeps: closed (S2), files as strings (S4), no flags (S6)."""
    where = (*at, *sub_path)
    shown = "/".join(map(str, sub_path)) or "(root)"
    if is_object_schema(sub) and sub.get("additionalProperties") is not False:
        yield Finding(
            "I001",
            doc.path,
            doc.line_of(*where),
            f"tool '{tool}' {at[-1]}: the object at '{shown}' does not close its properties (S2)",
            '"additionalProperties": false on every object schema, nested and in $defs',
            'add "additionalProperties": false',
        )
    fmt = sub.get("format")
    if fmt in FILE_FORMATS and types_of(sub) != {"string"}:
        yield Finding(
            "I006",
            doc.path,
            doc.line_of(*where),
            f"tool '{tool}' {at[-1]}: format '{fmt}' at '{shown}' is on a property that is not a string (S4)",
            f'"type": "string" beside "format": "{fmt}"',
            'make the property {"type": "string", "format": ...}',
        )
    for keyword in sorted(NEW_KEYWORDS.intersection(sub)):
        yield Finding(
            "I015",
            doc.path,
            doc.line_of(*where, keyword),
            f"tool '{tool}' {at[-1]}: '{keyword}' at '{shown}' is a 2020-12 keyword the conformance fuzzer "
            "(hypothesis-jsonschema, drafts 4-7) cannot honour; its generated inputs ignore it",
            "keywords of drafts 4-7 where an equivalent exists",
            _DRAFT7_EQUIVALENT.get(keyword, "keep it if needed: the conformance report lists it as not fuzzed"),
        )
    for name in _feature_flags(sub):
        yield Finding(
            "I008",
            doc.path,
            doc.line_of(*where, "properties", name),
            f"tool '{tool}' {at[-1]}: '{name}' looks like a feature flag (S6)",
            "no optional capabilities: a field every connector fills, or another interface",
            f"remove '{name}'; make the data it guards optional instead",
        )


def _feature_flags(schema: dict[str, Any]) -> list[str]:
    """Properties named like a flag: 'capabilities', or a boolean 'supportsX' / 'hasX' / 'canX'."""
    return [
        name
        for name, prop in (schema.get("properties") or {}).items()
        if isinstance(prop, dict)
        and (name.lower() in _FLAG_NAMES or (_FLAG.match(name) and types_of(prop) == {"boolean"}))
    ]
