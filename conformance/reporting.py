"""The result of one check run: per item (outcome, duration, minimal example) and per interface version.

The pytest plugin gathers an `ItemResult` from each test report (on the xdist controller, reports
come from every worker) and writes `run_document` as the JSON result (`--json`). `summarize` folds
items into an `InterfaceSummary` per interface version: the figures the terminal summary prints,
the catalog's result files record, and the listing's tier is derived from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RUN_FORMAT", "InterfaceSummary", "ItemResult", "KindCount", "render_summary", "summarize"]

RUN_FORMAT = "handler.conformance-run/v1"
KINDS = ("case", "fuzz", "refuse")


@dataclass(frozen=True)
class ItemResult:
    """One test item's outcome, as the JSON result and the summary show it."""

    nodeid: str
    kind: str  # case | fuzz | refuse
    interface: str  # "ocr/v1"
    name: str  # the case's name or the tool's
    outcome: str  # passed | failed | skipped
    duration: float
    example: Any = None  # the minimal failing input, if it failed with one
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["details"] = dict(self.details)
        out["duration"] = round(self.duration, 4)
        return out


@dataclass
class KindCount:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    @property
    def all_passed(self) -> bool:
        return self.failed == 0 and self.skipped == 0

    def add(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)


@dataclass
class InterfaceSummary:
    """How one interface version fared in a run."""

    interface: str
    cases: KindCount = field(default_factory=KindCount)
    fuzz: KindCount = field(default_factory=KindCount)
    refuse: KindCount = field(default_factory=KindCount)
    examples: int = 0  # valid inputs generated and sent
    refused_inputs: int = 0  # invalid inputs sent
    not_honoured: list[str] = field(default_factory=list)  # 2020-12 keywords the generator ignored
    measured: dict[str, dict[str, float]] = field(default_factory=dict)  # case → its word error rates, by place

    @property
    def cases_pass(self) -> bool:
        return self.cases.all_passed

    @property
    def fuzzing_pass(self) -> bool:
        return self.fuzz.total > 0 and self.fuzz.all_passed and self.refuse.all_passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "cases": asdict(self.cases),
            "fuzz": asdict(self.fuzz),
            "refuse": asdict(self.refuse),
            "examples": self.examples,
            "refused_inputs": self.refused_inputs,
            "not_honoured": list(self.not_honoured),
            "measured": {case: dict(rates) for case, rates in sorted(self.measured.items())},
            "cases_pass": self.cases_pass,
            "fuzzing_pass": self.fuzzing_pass,
        }


def summarize(items: Iterable[ItemResult], interfaces: Iterable[str]) -> dict[str, InterfaceSummary]:
    """Fold item results into one summary per interface version (every version named appears)."""
    out = {key: InterfaceSummary(key) for key in interfaces}
    for item in items:
        summary = out.setdefault(item.interface, InterfaceSummary(item.interface))
        count = {"case": summary.cases, "fuzz": summary.fuzz, "refuse": summary.refuse}[item.kind]
        count.add(item.outcome)
        summary.examples += int(item.details.get("examples", 0))
        summary.refused_inputs += int(item.details.get("invalid_inputs", 0))
        if item.kind == "case" and item.details.get("measured"):
            summary.measured[item.name] = dict(item.details["measured"])
        for note in item.details.get("not_honoured", ()):
            line = f"{item.name}: {note}"
            if line not in summary.not_honoured:
                summary.not_honoured.append(line)
    return out


def render_summary(summaries: Mapping[str, InterfaceSummary]) -> list[str]:
    """The terminal summary's lines: one per interface version, then what the fuzzer could not honour."""
    lines = []
    for key, s in sorted(summaries.items()):
        verdict = "PASS" if s.cases_pass and s.fuzzing_pass else "FAIL"
        lines.append(f"{verdict} {key}: cases {_count(s.cases)}, fuzzing {_count(s.fuzz)} ({s.examples} valid inputs),"
                     f" refusals {_count(s.refuse)} ({s.refused_inputs} invalid inputs)")
        for case, rates in sorted(s.measured.items()):
            shown = ", ".join(f"{where} {rate:.1%}" for where, rate in rates.items())
            lines.append(f"     measured in case '{case}': {shown}")
        for note in s.not_honoured:
            lines.append(f"     not fuzzed as written: {note} is a 2020-12 keyword hypothesis-jsonschema "
                         "(drafts 4-7) cannot honour; generated inputs ignore it and those it rules out are dropped")
    return lines


def _count(count: KindCount) -> str:
    text = f"{count.passed}/{count.total} passed"
    if count.skipped:
        text += f", {count.skipped} skipped"
    return text
