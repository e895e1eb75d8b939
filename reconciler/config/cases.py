"""The conformance case grammar (docs/architecture.md §9): parsed here so the checks and the runner agree.

A case names a tool, an input and what the output must satisfy — properties, never exact outputs:

    [[case]]
    name = "invoice text"
    tool = "ocr_extract"
    input = { path = "invoice.pdf" }
    expect.contains = ["INV-2024-0042", "Total"]
    expect.pages.minItems = 1

`expect.error` and `expect.contains` are reserved; every other key is a dotted path into the
output (an integer segment indexes an array, `*` means every item) ending in an assertion. Two
assertions take a table: `expect.text.wordErrorRate = { reference = "...", maximum = 0.3 }` and
`expect.vectors.nearerByCosine = { anchor = 0, near = 1, far = 2 }`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ASSERTIONS", "TABLE_ASSERTIONS", "Assertion", "Case", "CaseError", "parse_case"]

ASSERTIONS = frozenset(
    {"minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "equals", "matches", "contains", "exists",
     "wordErrorRate", "nearerByCosine"}
)
# Assertions whose value is a table: `wordErrorRate = { reference = "the words said", maximum = 0.3 }`,
# `nearerByCosine = { anchor = 0, near = 1, far = 2 }` (an optional `margin`).
TABLE_ASSERTIONS = frozenset({"wordErrorRate", "nearerByCosine"})
_CASE_KEYS = frozenset({"name", "tool", "input", "expect", "description"})


class CaseError(ValueError):
    """A case does not follow the grammar; `key` is where, relative to the case."""

    def __init__(self, message: str, key: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class Assertion:
    path: tuple[str | int, ...]  # "*" stands for every item of an array
    op: str
    value: Any

    def describe(self) -> str:
        where = ".".join(str(p) for p in self.path) or "(output)"
        return f"{where}.{self.op} = {self.value!r}"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    tool: str
    input: dict[str, Any]
    error: str | None = None
    contains: tuple[str, ...] = ()
    assertions: tuple[Assertion, ...] = ()


def parse_case(raw: Any) -> Case:
    """Turn one `[[case]]` table into a `Case`, or raise `CaseError` saying what is wrong."""
    if not isinstance(raw, dict):
        raise CaseError("a case is a table")
    for key in raw:
        if key not in _CASE_KEYS:
            raise CaseError(f"unknown key '{key}' in a case; known: {', '.join(sorted(_CASE_KEYS))}", (key,))
    name, tool = raw.get("name"), raw.get("tool")
    if not isinstance(name, str) or not name:
        raise CaseError('a case needs name = "..."', ("name",))
    if not isinstance(tool, str) or not tool:
        raise CaseError(f"case '{name}' needs tool = \"<tool name>\"", ("tool",))
    inp = raw.get("input", {})
    if not isinstance(inp, dict):
        raise CaseError(f"case '{name}': input is a table of arguments", ("input",))
    expect = raw.get("expect", {})
    if not isinstance(expect, dict):
        raise CaseError(f"case '{name}': expect is a table", ("expect",))
    error = expect.get("error")
    if error is not None and not isinstance(error, str):
        raise CaseError(f"case '{name}': expect.error is an error code string", ("expect", "error"))
    contains = expect.get("contains", [])
    if isinstance(contains, str):
        contains = [contains]
    if not isinstance(contains, list) or not all(isinstance(c, str) for c in contains):
        raise CaseError(f"case '{name}': expect.contains is a list of strings", ("expect", "contains"))
    assertions: list[Assertion] = []
    for key, value in expect.items():
        if key not in ("error", "contains"):
            _collect(name, (key,), value, assertions)
    if error is not None and (contains or assertions):
        raise CaseError(f"case '{name}': expect.error cannot be combined with output assertions", ("expect",))
    return Case(name, tool, dict(inp), error, tuple(contains), tuple(assertions))


def _collect(case: str, path: tuple[str, ...], value: Any, out: list[Assertion]) -> None:
    if path[-1] in TABLE_ASSERTIONS:
        if path[-1] == "wordErrorRate":
            _check_word_error_rate(case, path, value)
        else:
            _check_nearer_by_cosine(case, path, value)
        segments = tuple(int(p) if p.isdigit() else p for p in path[:-1])
        out.append(Assertion(segments, path[-1], dict(value)))
        return
    if path[-1] in ASSERTIONS and not isinstance(value, dict):
        segments = tuple(int(p) if p.isdigit() else p for p in path[:-1])
        out.append(Assertion(segments, path[-1], value))
        return
    if not isinstance(value, dict):
        known = ", ".join(sorted(ASSERTIONS))
        raise CaseError(
            f"case '{case}': expect.{'.'.join(path)} does not end in an assertion (one of {known})",
            ("expect", *path),
        )
    for key, inner in value.items():
        _collect(case, (*path, key), inner, out)


def _check_word_error_rate(case: str, path: tuple[str, ...], value: Any) -> None:
    where = f"case '{case}': expect.{'.'.join(path)}"
    if not isinstance(value, dict) or set(value) != {"reference", "maximum"}:
        raise CaseError(f'{where} is a table {{ reference = "the words said", maximum = 0.3 }}', ("expect", *path))
    reference, maximum = value["reference"], value["maximum"]
    if not isinstance(reference, str) or not reference.split():
        raise CaseError(f"{where}.reference is the text said, at least one word", ("expect", *path, "reference"))
    if isinstance(maximum, bool) or not isinstance(maximum, int | float) or maximum < 0:
        raise CaseError(f"{where}.maximum is a number, 0 or more (0.3: at most 3 errors in 10 words)",
                        ("expect", *path, "maximum"))


def _check_nearer_by_cosine(case: str, path: tuple[str, ...], value: Any) -> None:
    where = f"case '{case}': expect.{'.'.join(path)}"
    shape = f"{where} is a table {{ anchor = 0, near = 1, far = 2 }} (item indexes; margin = 0.1 optional)"
    if not isinstance(value, dict) or not {"anchor", "near", "far"} <= set(value) <= {"anchor", "near", "far",
                                                                                      "margin"}:
        raise CaseError(shape, ("expect", *path))
    indexes = [value[k] for k in ("anchor", "near", "far")]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in indexes) or len(set(indexes)) != 3:
        raise CaseError(f"{where}: anchor, near and far are three different item indexes (0 or more)",
                        ("expect", *path))
    margin = value.get("margin", 0)
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin < 2:
        raise CaseError(f"{where}.margin is a number from 0 to 2: how much nearer, in cosine similarity",
                        ("expect", *path, "margin"))
