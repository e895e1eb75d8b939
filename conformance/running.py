"""One check run inside pytest: collecting interface versions into items, running them, gathering results.

The plugin (`conformance.plugin`) creates a `CheckRun` when `--handler-connector` is given and
registers it as a plugin of its own, so these hooks exist only in a check. Each `interface.toml`
of a version the connector implements collects into a `CaseItem` per case and a `FuzzItem` and a
`RefuseItem` per tool. Each process starts its harness (router and connector) on its first item and
stops it at the session's end; the controller (the only process under xdist that writes) gathers
every report into the JSON result and prints the summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.cases import evaluate_case, measured_rates, spoken_files
from conformance.errors import CheckError
from conformance.failures import ConformanceFailure, failures_in, show_json
from conformance.generating import realize_case
from conformance.harness import Harness
from conformance.replies import Reply
from conformance.reporting import RUN_FORMAT, ItemResult, render_summary, summarize
from conformance.workspace import Subject
from reconciler.config import Case, InterfaceVersion
from reconciler.config.models import Tool

__all__ = ["CaseItem", "CheckRun", "FuzzItem", "InterfaceFile", "RefuseItem"]

_PROP = "handler."


class CheckRun:
    """One check in one pytest process: what is checked, the harness (lazily), and the gathered results."""

    def __init__(self, config: pytest.Config, subject: Subject, seed: int, examples: int, *, worker: bool) -> None:
        self.config = config
        self.subject = subject
        self.seed = seed
        self.examples = examples
        self.worker = worker
        self.results: list[ItemResult] = []
        self.started = time.time()
        self._harness: Harness | None = None
        self._harness_error: str | None = None
        folders = {(subject.root / iface.folder / "interface.toml").resolve(): iface for iface in subject.interfaces}
        self._by_manifest = folders

    # --- collection and the harness -------------------------------------------------------------

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        iface = self._by_manifest.get(file_path.resolve()) if file_path.name == "interface.toml" else None
        if iface is None:
            return None
        found: InterfaceFile = InterfaceFile.from_parent(parent, path=file_path)
        found.bind(self, iface)
        return found

    def harness(self) -> Harness:
        """This process's router and connector, started on the first item that needs them."""
        if self._harness_error is not None:
            raise CheckError(self._harness_error)
        if self._harness is None:
            try:
                self._harness = Harness.start(self.subject)
            except CheckError as exc:
                self._harness_error = str(exc)
                raise
        if self._harness.start_error is not None:
            raise CheckError(f"the connector did not start: {self._harness.start_error}")
        return self._harness

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self._harness is not None:
            self._harness.close()
            self._harness = None
        path = self.config.getoption("handler_json")
        if path and not self.worker:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(self.run_document(int(exitstatus)), indent=2, ensure_ascii=False) + "\n")

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["handler_seed"] = self.seed  # xdist: the seed the controller chose

    @property
    def expected_items(self) -> int:
        """How many items a full run has: a check run with fewer (-k, -x) is not evidence for the catalog."""
        return sum(len(iface.cases) + 2 * len(iface.tools) for iface in self.subject.interfaces)

    # --- reports ------------------------------------------------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        keys = ", ".join(iface.key for iface in self.subject.interfaces)
        return [f"handler: connector {self.subject.connector.name} with binding {self.subject.binding.name} on "
                f"{keys}; {self.examples} examples per tool, seed {self.seed}"]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = {k[len(_PROP):]: str(v) for k, v in report.user_properties if k.startswith(_PROP)}
        if "kind" not in props:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
            message = "" if report.passed else _short_text(report)
            example = json.loads(props["example"]) if "example" in props else None
            details = {k: json.loads(v) for k, v in props.items() if k.startswith("detail.")}
            self.results.append(ItemResult(report.nodeid, props["kind"], props["interface"], props["name"], outcome,
                                           report.duration, example, message,
                                           {k.removeprefix("detail."): v for k, v in details.items()}))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker:
            return
        summaries = summarize(self.results, [iface.key for iface in self.subject.interfaces])
        terminalreporter.section("conformance summary")
        for line in render_summary(summaries):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"seed {self.seed}: replay with {self.replay_command()}")

    def replay_command(self, select: str | None = None) -> str:
        words = ["handler", "connector", "check", self.subject.connector.name, "--binding",
                 self.subject.binding.name, "--seed", str(self.seed), "--examples", str(self.examples)]
        if select:
            words += ["-k", select]
        return shlex.join(words)

    def run_document(self, exitstatus: int) -> dict[str, Any]:
        """The JSON result of this run (see `reporting`)."""
        subject = self.subject
        summaries = summarize(self.results, [iface.key for iface in subject.interfaces])
        complete = len(self.results) == self.expected_items and exitstatus in (0, 1)
        # A partial run (-k) passes on the items it ran; a complete one also needs every interface to pass.
        passed = exitstatus == 0 and all(item.outcome == "passed" for item in self.results) and (
            not complete or all(s.cases_pass and s.fuzzing_pass for s in summaries.values()))
        return {
            "format": RUN_FORMAT,
            "connector": subject.connector.name,
            "binding": subject.binding.name,
            "connector_hash": subject.connector.content_hash,
            "binding_hash": subject.binding.content_hash,
            "commit": _git_head(subject.root),
            "tree": subject.source.revision,
            "started": _iso(self.started),
            "seconds": round(time.time() - self.started, 3),
            "seed": self.seed,
            "examples": self.examples,
            "workers": _workers(self.config),
            "complete": complete,
            "passed": passed,
            "interfaces": {
                iface.key: {"interface_hash": iface.content_hash, **summaries[iface.key].to_dict()}
                for iface in subject.interfaces
            },
            "items": [item.to_dict() for item in self.results],
        }


class InterfaceFile(pytest.File):
    """An interface version's `interface.toml`, collected into its cases and its fuzzed tools."""

    run: CheckRun
    iface: InterfaceVersion

    def bind(self, run: CheckRun, iface: InterfaceVersion) -> None:
        self.run, self.iface = run, iface

    def collect(self) -> Iterator[pytest.Item]:
        for case in self.iface.cases:
            yield CaseItem.from_parent(self, name=f"case[{case.name}]").bound(self.run, self.iface, case.tool, case)
        for tool in self.iface.tools:
            yield FuzzItem.from_parent(self, name=f"fuzz[{tool.name}]").bound(self.run, self.iface, tool.name)
            yield RefuseItem.from_parent(self, name=f"refuse[{tool.name}]").bound(self.run, self.iface, tool.name)


class ConformanceItem(pytest.Item):
    """An item of a check: which interface version and tool, and how to report a failure of it."""

    kind = "item"
    run: CheckRun
    iface: InterfaceVersion
    tool_name: str
    case: Case | None = None

    def bound(self, run: CheckRun, iface: InterfaceVersion, tool: str, case: Case | None = None) -> ConformanceItem:
        self.run, self.iface, self.tool_name, self.case = run, iface, tool, case
        label = case.name if case is not None else tool
        self.user_properties += [(_PROP + "kind", self.kind), (_PROP + "interface", iface.key),
                                 (_PROP + "name", label)]
        return self

    @property
    def tool(self) -> Tool:
        found = self.iface.tool(self.tool_name)
        if found is None:
            raise CheckError(f"{self.iface.key} has no tool '{self.tool_name}'; its tools: "
                             f"{', '.join(t.name for t in self.iface.tools)}")
        return found

    def call(self, arguments: Any) -> Reply:
        return self.run.harness().call(self.iface.key, self.tool_name, arguments)

    def note(self, key: str, value: Any) -> None:
        self.user_properties.append((_PROP + key, json.dumps(value, ensure_ascii=False)))

    def start(self) -> Harness:
        harness = self.run.harness()
        # Which process and router ran the item: under xdist, each worker has its own.
        self.note("detail.worker", os.environ.get("PYTEST_XDIST_WORKER", "main"))
        self.note("detail.router", str(harness.folder))
        return harness

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name

    def runtest(self) -> None:
        try:
            self.check()
        except BaseException as exc:
            # The minimal example (hypothesis re-raises the shrunk one last) goes into the JSON result.
            found = next(failures_in(exc), None)
            if found is not None:
                self.note("example", found.arguments)
            raise

    def check(self) -> None:
        raise NotImplementedError

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        found = list(failures_in(excinfo.value))
        if found:
            text = "\n\n".join(f.render() for f in found)
            return f"{text}\n  replay: {self.run.replay_command(self.select())}"
        if isinstance(excinfo.value, CheckError):
            return f"the check could not run: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def select(self) -> str:
        return f"{self.kind} and {self.tool_name}"


class CaseItem(ConformanceItem):
    """A case of the interface's conformance/cases.toml, called with its fixture files."""

    kind = "case"

    def check(self) -> None:
        if self.case is None:
            raise CheckError(f"{self.name} has no case")
        tool = self.tool  # a case naming an unknown tool fails here, listing the known ones
        harness = self.start()
        work = harness.workspace.scopes[self.iface.key] if harness.workspace is not None else Path()
        case, drawn = realize_case(self.case, dict(self.iface.fixtures), work)
        if drawn:
            self.note("detail.generated", drawn)
        reply = self.call(case.input)
        heard, problems = self.hear(case, reply)
        problems += evaluate_case(case, reply, heard)
        if not reply.is_error:
            rates = measured_rates(case, reply.output, heard)
            if rates:
                self.note("detail.measured", rates)
        if problems:
            details = list(problems)
            if reply.is_error and reply.cause:
                details.append(f"router: {reply.describe_error()}")
            output = reply.output if not reply.is_error else reply.connector_output
            if output is not None:
                details.append(f"output: {show_json(output)}")
            raise CaseFailed(f"case '{self.case.name}' ({tool.name}): {len(problems)} problem(s)",
                             case.input, details)

    def hear(self, case: Case, reply: Reply) -> tuple[dict[str, str], list[str]]:
        """The transcript of each audio file the case's `spokenWordErrorRate` names, by its transcriber through
        the same router; and why any could not be heard."""
        heard: dict[str, str] = {}
        problems: list[str] = []
        if reply.is_error:
            return heard, problems
        for key, path in spoken_files(case, reply.output):
            if key not in self.run.harness().workspace_profiles():
                problems.append(f"no binding of a local connector (egress = []) implementing {key} in the tree, to "
                                f"hear {path!r} back; add one (config/bindings/) and run the check again")
                continue
            iface = self.run.subject.source.interfaces[key]
            tool = iface.tools[0]
            arg = next(name for name, prop in tool.inputSchema.get("properties", {}).items()
                       if isinstance(prop, dict) and prop.get("format") == "handler-file")
            answer = self.run.harness().call(key, tool.name, {arg: path})
            text = answer.output.get("text") if not answer.is_error and isinstance(answer.output, dict) else None
            if isinstance(text, str):
                heard[path] = text
            else:
                problems.append(f"{key} could not hear {path!r} back: {answer.describe_error()}")
        return heard, problems

    def select(self) -> str:
        name = self.case.name if self.case is not None else ""
        words = [w for w in name.replace("-", " ").split() if w.isidentifier()]
        return " and ".join(["case", *words]) if words else "case"


class CaseFailed(ConformanceFailure):
    kind = "case failed"


class FuzzItem(ConformanceItem):
    """Valid inputs generated from the tool's inputSchema; each result judged (`failures.judge_output`)."""

    kind = "fuzz"

    def check(self) -> None:
        # hypothesis-jsonschema is imported at the first fuzzed tool: importing it reads hypothesis's
        # Unicode tables, which hypothesis asks plugins not to do while pytest starts.
        from conformance.fuzzing import FuzzStats, NoFixturesError, fuzz_tool, unhonoured_keywords

        tool = self.tool
        missing = unhonoured_keywords(tool.inputSchema)
        self.note("detail.not_honoured", missing)
        self.start()
        stats = FuzzStats()
        try:
            fuzz_tool(self.call, tool, sorted(self.iface.fixtures), self.iface.error_codes,
                      examples=self.run.examples, seed=self.run.seed, stats=stats, addresses=self.addresses())
        except NoFixturesError as exc:
            pytest.skip(f"{self.iface.key} {tool.name}: {exc}")
        finally:
            self.note("detail.examples", stats.examples)
            self.note("detail.outcomes", dict(stats.outcomes))


    def addresses(self) -> list[str]:
        """The web addresses the interface's cases call this tool with: pages the check serves."""
        return sorted({value for case in self.iface.cases if case.tool == self.tool.name
                       for value in case.input.values() if isinstance(value, str)
                       and value.startswith(("http://", "https://"))})


class RefuseItem(ConformanceItem):
    """Invalid inputs derived from the tool's inputSchema, each to be refused before the connector."""

    kind = "refuse"

    def check(self) -> None:
        from conformance.fuzzing import invalid_inputs, refuse_invalid  # see FuzzItem.check

        mutations = invalid_inputs(self.tool.inputSchema, sorted(self.iface.fixtures))
        self.start()
        self.note("detail.invalid_inputs", len(mutations))
        refuse_invalid(self.call, mutations)


def _short_text(report: pytest.TestReport, limit: int = 4000) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    text = report.longreprtext
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _workers(config: pytest.Config) -> int:
    value = getattr(config.option, "numprocesses", None)
    return int(value) if isinstance(value, int) and value > 0 else 1


def _git_head(root: Path) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False, timeout=10)
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
