"""What a conformance cases.toml shows: every I013, on its own and beside its interface version.

`read_cases` runs on the file alone (its tables follow the grammar of `config.cases`), so the loader
caches it with the file's content; `check_cases` then reads the cases against their interface
version: the tools they call, the errors they expect and the fixtures they read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from reconciler.config.cases import (
    Case,
    CaseError,
    parse_case,
    read_sentence_patterns,
    read_word_list,
)
from reconciler.config.documents import Document
from reconciler.config.findings import Finding, suggest
from reconciler.config.snapshot import InterfaceVersion, Snapshot

__all__ = ["check_cases", "read_cases"]


def read_cases(doc: Document, value: Any) -> tuple[tuple[Case, ...], list[Finding]]:
    """The cases of a parsed cases.toml, and a finding for each key or case off the grammar."""
    findings = [
        Finding(
            "I013",
            doc.path,
            doc.line_of(key),
            f"unknown key '{key}' in cases.toml",
            "only [[case]] tables",
            "write each case as a [[case]] table",
        )
        for key in value
        if key != "case"
    ]
    raw = value.get("case", [])
    cases: list[Case] = []
    for index, item in enumerate(raw if isinstance(raw, list) else []):
        try:
            cases.append(parse_case(item))
        except CaseError as exc:
            findings.append(
                Finding(
                    "I013",
                    doc.path,
                    doc.line_of("case", index, *exc.key),
                    str(exc),
                    "a case in the grammar of docs/conformance.md",
                    "see docs/conformance.md for every assertion with an example",
                )
            )
    return tuple(cases), findings


def check_cases(snapshot: Snapshot, key: str) -> Iterator[Finding]:
    """Each case of interface version `key` calls one of its tools, expects one of its errors, reads its fixtures."""
    iface = snapshot.interfaces[key]
    file = f"{iface.folder}/conformance/cases.toml"
    tools = {t.name: t for t in iface.tools}
    for i, case in enumerate(iface.cases):
        tool = tools.get(case.tool)
        if tool is None:
            hint = suggest(case.tool, tools)
            yield Finding(
                "I013",
                file,
                snapshot.line_of(file, "case", i, "tool"),
                f"case '{case.name}' calls '{case.tool}', which {key} does not define{hint.did_you_mean}",
                hint.one_of,
                "correct the tool name",
            )
            continue
        if case.error is not None and case.error not in iface.error_codes:
            hint = suggest(case.error, sorted(iface.error_codes))
            yield Finding(
                "I013",
                file,
                snapshot.line_of(file, "case", i, "expect", "error"),
                f"case '{case.name}' expects error '{case.error}', which is not in {key}'s list{hint.did_you_mean}",
                hint.one_of,
                "correct the code",
            )
        yield from _check_fixtures(snapshot, iface, i, case, tool.inputSchema)
        yield from _check_generators(snapshot, iface, i, case)
        yield from _check_transcribers(snapshot, iface, i, case)


def _check_generators(snapshot: Snapshot, iface: InterfaceVersion, index: int, case: Case) -> Iterator[Finding]:
    """Each generator's word list or sentences file is a fixture of the folder, and reads as one."""
    file = f"{iface.folder}/conformance/cases.toml"
    for gen in case.generate:
        if gen.kind == "page":
            continue
        line = snapshot.line_of(file, "case", index, "generate", gen.name, gen.kind)
        data = iface.fixtures.get(gen.source)
        if data is None:
            yield Finding("I013", file, line, f"case '{case.name}': generate.{gen.name} draws from '{gen.source}', "
                          f"which is not in {iface.folder}/conformance/", "a fixture file beside cases.toml",
                          f"add {iface.folder}/conformance/{gen.source}")
            continue
        try:
            empty = not (read_word_list(data) if gen.kind == "words" else read_sentence_patterns(data).patterns)
        except (CaseError, UnicodeDecodeError) as exc:
            yield Finding("I013", file, line, f"case '{case.name}': '{gen.source}' is not a {gen.kind} file: {exc}",
                          "the format of docs/conformance.md, 'Inputs drawn afresh'", f"correct {gen.source}")
            continue
        if empty:
            yield Finding("I013", file, line, f"case '{case.name}': '{gen.source}' holds no words to draw",
                          "at least one word", f"add words to {gen.source}")


def _check_transcribers(snapshot: Snapshot, iface: InterfaceVersion, index: int, case: Case) -> Iterator[Finding]:
    """A spokenWordErrorRate names an interface version of the tree that hears audio."""
    file = f"{iface.folder}/conformance/cases.toml"
    for assertion in case.assertions:
        if assertion.op != "spokenWordErrorRate":
            continue
        key = assertion.value["transcriber"]
        if key not in snapshot.interfaces:
            hint = suggest(key, sorted(snapshot.interfaces))
            path = ["expect", *(str(p) for p in assertion.path), assertion.op, "transcriber"]
            yield Finding("I013", file, snapshot.line_of(file, "case", index, *path),
                          f"case '{case.name}' is heard back by '{key}', which is not an interface version of the "
                          f"tree{hint.did_you_mean}", hint.one_of, "name the transcriber's interface version")


def _check_fixtures(
    snapshot: Snapshot, iface: InterfaceVersion, index: int, case: Case, schema: dict[str, Any]
) -> Iterator[Finding]:
    """Every file argument (format handler-file) of the case names a fixture beside cases.toml."""
    file = f"{iface.folder}/conformance/cases.toml"
    props = schema.get("properties", {})
    pages = {g.name for g in case.generate if g.kind == "page"}
    for arg, value in case.input.items():
        prop = props.get(arg)
        if isinstance(value, str) and value in {"{" + name + "}" for name in pages}:
            continue  # a page drawn afresh, written into the work folder by the check
        if isinstance(prop, dict) and prop.get("format") == "handler-file" and value not in iface.fixtures:
            yield Finding(
                "I013",
                file,
                snapshot.line_of(file, "case", index, "input", arg),
                f"case '{case.name}' reads '{value}', which is not in {iface.folder}/conformance/",
                "a fixture file beside cases.toml",
                f"add {iface.folder}/conformance/{value}",
            )
