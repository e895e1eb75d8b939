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
`expect.vectors.nearerByCosine = { anchor = 0, near = 1, far = 2 }`; and one, `spokenWordErrorRate`,
names a transcriber: the audio file at the path is heard back by the local connector of that interface.

A case may draw its inputs afresh on each run, so that no connector can recognise them (`generate`):

    generate.text = { sentences = "sentences.toml", count = 6 }   # sentences from the file's patterns
    generate.words = { words = "words.txt", count = 24 }          # words drawn from the file's list
    generate.scan = { page = "{words}" }                          # a PNG of the text, in the work folder
    input = { path = "{scan}" }

Each `{name}` in a string of `input` or `expect` is replaced by what `generate.name` drew; the word
lists are fixture files of the conformance folder (`read_word_list`, `read_sentence_patterns`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any

__all__ = ["ASSERTIONS", "GENERATORS", "TABLE_ASSERTIONS", "Assertion", "Case", "CaseError", "Generator",
           "SentencePatterns", "parse_case", "placeholders_in", "read_sentence_patterns", "read_word_list"]

ASSERTIONS = frozenset(
    {"minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "equals", "matches", "contains", "exists",
     "wordErrorRate", "nearerByCosine", "spokenWordErrorRate"}
)
# Assertions whose value is a table: `wordErrorRate = { reference = "the words said", maximum = 0.3 }`,
# `nearerByCosine = { anchor = 0, near = 1, far = 2 }` (an optional `margin`).
# `spokenWordErrorRate = { reference = "...", maximum = 0.45, transcriber = "transcribe/v1" }`.
TABLE_ASSERTIONS = frozenset({"wordErrorRate", "nearerByCosine", "spokenWordErrorRate"})
_CASE_KEYS = frozenset({"name", "tool", "input", "expect", "description", "generate"})
# What a generator draws: words of a list, sentences of patterns (both from a fixture file), or a page image.
GENERATORS = ("words", "sentences", "page")
MAX_DRAWN = 200  # words or sentences one generator draws
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")  # in a case's strings, and a pattern's slots


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
class Generator:
    """`generate.<name>`: `kind` words or sentences drawn (`count`) from the fixture file `source`, or a page
    image of the text `source` (which may hold the placeholders of generators declared before it)."""

    name: str
    kind: str
    source: str
    count: int = 0


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    tool: str
    input: dict[str, Any]
    error: str | None = None
    contains: tuple[str, ...] = ()
    assertions: tuple[Assertion, ...] = ()
    generate: tuple[Generator, ...] = ()


@dataclass(frozen=True, slots=True)
class SentencePatterns:
    """A sentences file: patterns such as "the {adjective} {noun} opened", and the words of each slot."""

    patterns: tuple[str, ...]
    slots: dict[str, tuple[str, ...]]


def read_word_list(data: bytes) -> list[str]:
    """The words of a word-list file: one or more per line, split on white space; `#` starts a comment."""
    text = data.decode("utf-8")
    return [word for line in text.splitlines() for word in line.split("#", 1)[0].split()]


def read_sentence_patterns(data: bytes) -> SentencePatterns:
    """A sentences file (TOML: `patterns = [...]` and a list of words per slot); `CaseError` if malformed."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CaseError(f"not a TOML file of patterns ({exc})") from None
    patterns = raw.pop("patterns", None)
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise CaseError('it needs patterns = ["the {adjective} {noun} ...", ...], at least one')
    slots: dict[str, tuple[str, ...]] = {}
    for slot, words in raw.items():
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
            raise CaseError(f"slot '{slot}' is a list of words, at least one")
        slots[slot] = tuple(words)
    for pattern in patterns:
        missing = sorted(set(_PLACEHOLDER.findall(pattern)) - set(slots))
        if missing:
            raise CaseError(f"the pattern {pattern!r} names the slot(s) {', '.join(missing)}, which have no words")
    return SentencePatterns(tuple(patterns), slots)


def placeholders_in(value: Any) -> set[str]:
    """The `{name}` placeholders in every string of `value`."""
    if isinstance(value, str):
        return set(_PLACEHOLDER.findall(value))
    if isinstance(value, dict):
        return set().union(*(placeholders_in(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(placeholders_in(v) for v in value)) if value else set()
    return set()


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
    generate = _parse_generators(name, raw.get("generate", {}))
    if generate:
        declared = {g.name for g in generate}
        unknown = sorted((placeholders_in(inp) | placeholders_in(expect)) - declared)
        if unknown:
            raise CaseError(f"case '{name}' uses {', '.join('{' + u + '}' for u in unknown)}, which no generate.<name> "
                            f"draws; declared: {', '.join(sorted(declared))}", ("generate",))
    return Case(name, tool, dict(inp), error, tuple(contains), tuple(assertions), generate)


def _parse_generators(case: str, raw: Any) -> tuple[Generator, ...]:
    """`generate.<name> = { words = FILE, count = N }`, `{ sentences = FILE, count = N }` or `{ page = TEXT }`."""
    if not isinstance(raw, dict):
        raise CaseError(f"case '{case}': generate is a table of generate.<name> = {{ ... }}", ("generate",))
    found: list[Generator] = []
    for gen_name, spec in raw.items():
        where = f"case '{case}': generate.{gen_name}"
        key = ("generate", gen_name)
        if not _NAME.match(gen_name):
            raise CaseError(f"{where}: a name is lower case letters, digits and _, starting with a letter", key)
        kinds = [k for k in GENERATORS if isinstance(spec, dict) and k in spec]
        if not isinstance(spec, dict) or len(kinds) != 1:
            raise CaseError(f'{where} is one of {{ words = "words.txt", count = 24 }}, {{ sentences = '
                            f'"sentences.toml", count = 6 }} or {{ page = "{{words}}" }}', key)
        kind = kinds[0]
        source, count = spec[kind], spec.get("count", 0)
        allowed = {kind} if kind == "page" else {kind, "count"}
        extra = sorted(set(spec) - allowed)
        if extra:
            raise CaseError(f"{where}: unknown key(s) {', '.join(extra)}; a {kind} generator takes "
                            f"{', '.join(sorted(allowed))}", key)
        if not isinstance(source, str) or not source.strip():
            raise CaseError(f"{where}.{kind} is a string", (*key, kind))
        if kind != "page" and (isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_DRAWN):
            raise CaseError(f"{where}.count is how many {kind} to draw, 1 to {MAX_DRAWN}", (*key, "count"))
        before = {g.name for g in found}
        unknown = sorted(placeholders_in(source) - before) if kind == "page" else []
        if unknown:
            raise CaseError(f"{where}.page uses {', '.join('{' + u + '}' for u in unknown)}, which no generator "
                            "declared before it draws", (*key, kind))
        found.append(Generator(gen_name, kind, source, count))
    return tuple(found)


def _collect(case: str, path: tuple[str, ...], value: Any, out: list[Assertion]) -> None:
    if path[-1] in TABLE_ASSERTIONS:
        if path[-1] in ("wordErrorRate", "spokenWordErrorRate"):
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
    spoken = path[-1] == "spokenWordErrorRate"
    keys = {"reference", "maximum", "transcriber"} if spoken else {"reference", "maximum"}
    if not isinstance(value, dict) or set(value) != keys:
        shape = ('{ reference = "the words said", maximum = 0.3, transcriber = "transcribe/v1" }' if spoken
                 else '{ reference = "the words said", maximum = 0.3 }')
        raise CaseError(f"{where} is a table {shape}", ("expect", *path))
    if spoken and (not isinstance(value["transcriber"], str) or "/v" not in value["transcriber"]):
        raise CaseError(f'{where}.transcriber is the interface version that hears the audio back, such as '
                        '"transcribe/v1"', ("expect", *path, "transcriber"))
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
