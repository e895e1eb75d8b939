"""Findings of the save-time checks and the one registry of their codes.

Every check reports a `Finding`: where (file and line), a stable code from `CODES`, what is wrong,
what was expected and how to fix it. Codes never change meaning once released; the registry is
printed by `handler validate --codes` and listed in docs/checks.md.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["CODES", "Code", "Finding", "Severity", "Suggestion", "did_you_mean", "sort_findings", "suggest"]


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Code:
    id: str
    severity: Severity
    title: str


def _registry(*codes: Code) -> dict[str, Code]:
    table = {c.id: c for c in codes}
    if len(table) != len(codes):
        raise ValueError("two finding codes share an id")
    return table


E, W = Severity.ERROR, Severity.WARNING

CODES: dict[str, Code] = _registry(
    # files
    Code("F001", E, "the file is not valid TOML or JSON"),
    Code("F002", E, "apiVersion is missing or names another kind"),
    Code("F003", E, "name differs from the file or folder name"),
    Code("F004", E, "a field is unknown, missing or has the wrong type"),
    Code("F005", W, "a file in the config tree is not read by anything"),
    Code("F006", E, "a file in the config tree is a symbolic link, which is not followed"),
    Code("F007", E, "a name is longer than 100 characters"),
    Code("F008", E, "a file's name is not UTF-8"),
    Code("F009", E, "a file is larger than a file of the tree may be"),
    # interfaces
    Code("I001", E, "an object schema is open (S2)"),
    Code("I002", E, "a schema is not valid JSON Schema 2020-12"),
    Code("I003", E, "a $ref does not resolve"),
    Code("I004", E, "[errors] is missing or lacks unavailable (S3)"),
    Code("I005", E, "an error code is not snake_case (S3)"),
    Code("I006", E, "a handler-file format is on a non-string property (S4)"),
    Code("I007", E, "a tool name does not start with the interface name (S5)"),
    Code("I008", E, "a schema declares a feature flag (S6)"),
    Code("I009", E, "the version folder and the version field differ"),
    Code("I010", E, "a published version was changed"),
    Code("I011", E, "a tool does not state its action class in annotations"),
    Code("I012", E, "two tools share a name"),
    Code("I013", E, "a conformance case is malformed"),
    Code("I014", E, "an interface version lacks interface.toml or tools.json"),
    Code("I015", W, "a schema uses a 2020-12 keyword that schema-driven fuzzing cannot honour"),
    Code("I016", E, "an interface version has no skill, or more than one"),
    Code("I017", E, "a skill's front matter lacks its name or description, or names another folder"),
    # connectors
    Code("N001", E, "implements names an interface version that does not exist"),
    Code("N002", E, "an egress entry is not host:port"),
    Code("N003", E, "a connector supplies tool descriptions (S1)"),
    Code("N004", E, "[run] names neither a command nor a builtin"),
    Code("N005", E, "[wrap] maps a tool the connector does not implement"),
    Code("N006", E, "[wrap] names an unknown reshaper or an error outside the closed list"),
    Code("N007", E, "[run] runs a file the connector's folder does not hold"),
    Code("N008", E, "[wrap] renames an argument the interface tool does not have"),
    Code("N009", E, "a [wrap] error pattern is not a regular expression"),
    Code("N010", E, "[run] names a runtime the tree does not provide and [needs] does not declare"),
    Code("N011", W, "[run] passes a path outside the connector's folder, which its sandbox does not show"),
    Code("N012", E, "[run] runs code that is not in the connector's folder: inline, outside it or the machine's"),
    Code("N013", E, "a connector's folder holds compiled Python (.pyc, .pyo), which review cannot read"),
    # bindings
    Code("B001", E, "the binding's connector does not exist"),
    Code("B002", E, "a required secret slot is not filled"),
    Code("B003", E, "a secret slot holds a literal value"),
    Code("B004", E, "a secret slot is not declared by the connector"),
    Code("B005", E, "a setting is not declared by the connector"),
    Code("B006", E, "egress widens the connector's"),
    Code("B007", E, "a limit loosens the interface's"),
    Code("B008", E, "pricing names a tool the connector does not serve"),
    Code("B009", E, "a required setting is not filled"),
    Code("B010", E, "a binding names both or neither of connector and addon"),
    Code("B011", E, "base_url names a host:port the binding's egress does not reach"),
    # profiles
    Code("P001", E, "a selected binding does not exist, or its file does not load"),
    Code("P002", E, "the binding's connector does not implement the interface version"),
    Code("P003", E, "an interface is selected twice"),
    Code("P004", E, "routing names an unknown member"),
    Code("P005", E, "routing names a channel outside the Slack allow-list"),
    Code("P006", E, "routing to none contradicts pins or approve rules"),
    Code("P007", E, "the template does not exist"),
    Code("P008", E, "a rule names an unknown service or action"),
    Code("P009", E, "a pin names a service the profile does not use"),
    Code("P010", E, "a services key names an unknown interface"),
    Code("P011", E, "the selected binding is not a connector binding"),
    Code("P012", E, "the group is not declared in org.toml"),
    Code("P013", E, "scope is empty or climbs out with '..'"),
    Code("P014", W, "the name leaves little of a socket's path for the run folder"),
    Code("P015", W, "scope is the whole file system or a whole home folder"),
    Code("P016", E, "agents names a profile that does not exist"),
    Code("P017", W, "agents names a profile without a runner"),
    Code("P018", W, "agents lists agents to run, but the profile does not bind agent/v1"),
    # org
    Code("O001", E, "a required interface is not bound for a profile"),
    Code("O002", E, "a policy scope names something that does not exist"),
    Code("O003", E, "a policy approver names an unknown member or channel"),
    Code("O004", E, "a group lists an unknown member"),
    Code("O005", W, "no member is an owner, so unrouted holds have no approver"),
    Code("O006", E, "a default names an unknown template, interface or binding"),
    Code("O007", W, "org.toml is missing, so there are no owners, defaults or caps"),
    Code("O008", E, "[http.auth] names its identity provider by a URL that is not https"),
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a person should fix, at `file:line`."""

    code: str
    file: str
    line: int
    message: str
    expected: str = ""
    fix: str = ""

    @property
    def severity(self) -> Severity:
        return CODES[self.code].severity

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def to_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "expected": self.expected,
            "fix": self.fix,
        }

    def render_text(self) -> str:
        warning = "warning: " if self.severity is Severity.WARNING else ""
        # A control character of a name (a file called "x\n::error file=y::") is escaped, so no name
        # forges a line; a multi-line value keeps its lines under its first, so none reads as a finding of its own.
        lines = [_escape_controls(f"{self.file}:{self.line}: {self.code} {warning}{self.message}")]
        if self.expected:
            lines.append("  expected: " + _escape_controls(self.expected, keep="\n").replace("\n", "\n" + " " * 12))
        if self.fix:
            lines.append("  fix: " + _escape_controls(self.fix, keep="\n").replace("\n", "\n" + " " * 7))
        return "\n".join(lines)

    def render_github(self) -> str:
        level = "error" if self.is_error else "warning"
        body = self.message
        if self.expected:
            body += f"\nexpected: {self.expected}"
        if self.fix:
            body += f"\nfix: {self.fix}"
        return f"::{level} file={_escape_property(self.file)},line={self.line},title={self.code}::{_escape_data(body)}"


_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escape_controls(text: str, keep: str = "") -> str:
    """`text` with its control characters (but those in `keep`) written as escapes: \\n, \\x1b."""
    return _CONTROLS.sub(lambda m: m[0] if m[0] in keep else repr(m[0])[1:-1], text)


def _escape_data(text: str) -> str:
    # GitHub workflow commands: %, CR and LF are escaped in the message.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' when `name` is close to one of `known`, else ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Suggestion(NamedTuple):
    """What every finding about an unknown name offers: the closest known name and the choices."""

    did_you_mean: str  # " (did you mean 'x'?)" to end the message, or ""
    one_of: str  # "one of: a, b", for the finding's expected


def suggest(name: str, known: Iterable[str], *, none: str = "", among: str = "one of") -> Suggestion:
    """The parts of "unknown X 'name' (did you mean 'y'?)", expected "one of: a, b".

    `known` is listed in the order given; `none` stands in for an empty list ("(no tools)").
    """
    names = list(known)
    return Suggestion(did_you_mean(name, names), f"{among}: {', '.join(names) or none}")


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (f.file, f.line, f.code, f.message))
