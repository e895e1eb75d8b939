"""The pytest plugin itself, driven with pytester: its items, its reports, and each xdist worker's own router."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import conformance.fuzzing
import conformance.running  # noqa: F401 - imported once here: pytester's in-process runs would re-import them each
from tests.conformance.shout_tree import write_shout_tree

pytest_plugins = ["pytester"]

MANIFEST = "catalog/interfaces/shout/v1/interface.toml"
ITEMS = ["case[shouts]", "case[nothing to shout]", "case[reads a file]", "fuzz[shout_text]", "refuse[shout_text]",
         "fuzz[shout_file]", "refuse[shout_file]"]


@pytest.fixture
def tree(pytester: pytest.Pytester) -> Path:
    return write_shout_tree(pytester.path / "tree")


def options(tree: Path, binding: str = "shout-good", *more: str) -> list[str]:
    return [str(tree / MANIFEST), "-p", "no:cacheprovider", "--assert=plain", "--handler-connector", "shout",
            "--handler-binding", binding, "--handler-root", str(tree), "--handler-examples", "5", "--handler-seed", "5",
            *more]


def test_an_interface_version_collects_one_item_per_case_and_two_per_tool(pytester: pytest.Pytester,
                                                                         tree: Path) -> None:
    result = pytester.runpytest(*options(tree), "--collect-only", "-q")
    assert result.ret == 0
    assert [line.split("::")[1] for line in result.outlines if "::" in line] == ITEMS


def test_the_plugin_is_inert_without_a_connector(pytester: pytest.Pytester, tree: Path) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest("-p", "no:cacheprovider", str(tree), "test_plain.py")
    result.assert_outcomes(passed=1)  # the interface.toml under tree/ collects nothing


def test_a_run_in_process_reports_a_summary_and_a_json_result(pytester: pytest.Pytester, tree: Path) -> None:
    out = pytester.path / "result.json"
    result = pytester.runpytest(*options(tree, "shout-good", "--handler-json", str(out)))
    result.assert_outcomes(passed=7)
    result.stdout.fnmatch_lines(["*conformance summary*", "PASS shout/v1: cases 3/3 passed, fuzzing 2/2 passed*",
                                 "seed 5: replay with handler connector check shout --binding shout-good --seed 5*"])
    doc = json.loads(out.read_text())
    assert doc["format"] == "handler.conformance-run/v1"
    assert doc["passed"]
    assert doc["complete"]
    assert [i["nodeid"].split("::")[1] for i in doc["items"]] == ITEMS
    assert doc["interfaces"]["shout/v1"]["interface_hash"]


def test_a_failure_shows_the_minimal_input_the_output_and_how_to_replay(pytester: pytest.Pytester,
                                                                        tree: Path) -> None:
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest(*options(tree, "shout-extra-field", "-k", "fuzz and shout_text", "--junit-xml",
                                         str(junit), "-o", "junit_family=xunit1"))
    result.assert_outcomes(failed=1, deselected=6)
    result.stdout.fnmatch_lines([
        "output breaks the outputSchema: the connector's output breaks the outputSchema",
        '  input:  {"text": "0"}',
        '  output: {"text": "0", "length": 1, "debug": "left in by mistake"}',
        "  breaks: at /: Additional properties are not allowed ('debug' was unexpected)",
        "  schema: /additionalProperties",
        "  replay: handler connector check shout --binding shout-extra-field --seed 5 --examples 5 "
        "-k 'fuzz and shout_text'",
    ])
    report = ET.parse(junit).getroot()  # noqa: S314 - the report this test just wrote
    props = {p.get("name"): p.get("value") for p in report.iter("property")}
    assert json.loads(props["handler.example"] or "null") == {"text": "0"}


def test_each_xdist_worker_runs_its_own_router(pytester: pytest.Pytester, tree: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # As a check runs it: hypothesis's Unicode tables read from a cache, not rebuilt in each worker.
    monkeypatch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(Path(__file__).resolve().parents[2] / ".hypothesis"))
    out = pytester.path / "result.json"
    result = pytester.runpytest_subprocess(*options(tree, "shout-good", "-n", "2", "--handler-json", str(out)))
    result.assert_outcomes(passed=7)
    items = json.loads(out.read_text())["items"]
    assert len({i["details"]["worker"] for i in items}) == 2
    assert len({i["details"]["router"] for i in items}) == 2  # one router (and connector) per worker
    assert json.loads(out.read_text())["workers"] == 2


def test_a_misspelt_binding_is_a_usage_error_with_did_you_mean(pytester: pytest.Pytester, tree: Path) -> None:
    result = pytester.runpytest(*options(tree, "shout-godo"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no binding 'shout-godo'*did you mean 'shout-good'?*"])
