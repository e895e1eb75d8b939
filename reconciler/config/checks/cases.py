"""What a conformance cases.toml shows: every I013, on its own and beside its interface version.

`read_cases` runs on the file alone (its tables follow the grammar of `config.cases`), so the loader
caches it with the file's content; `check_cases` then reads the cases against their interface
version: the tools they call, the errors they expect and the fixtures they read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from reconciler.config.cases import Case, CaseError, parse_case
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


def _check_fixtures(
    snapshot: Snapshot, iface: InterfaceVersion, index: int, case: Case, schema: dict[str, Any]
) -> Iterator[Finding]:
    """Every file argument (format handler-file) of the case names a fixture beside cases.toml."""
    file = f"{iface.folder}/conformance/cases.toml"
    props = schema.get("properties", {})
    for arg, value in case.input.items():
        prop = props.get(arg)
        if isinstance(prop, dict) and prop.get("format") == "handler-file" and value not in iface.fixtures:
            yield Finding(
                "I013",
                file,
                snapshot.line_of(file, "case", index, "input", arg),
                f"case '{case.name}' reads '{value}', which is not in {iface.folder}/conformance/",
                "a fixture file beside cases.toml",
                f"add {iface.folder}/conformance/{value}",
            )
