"""`handler connector check` end to end: a real router, real connector processes, pytest underneath.

The broken connectors of `shout_connector.py` are each caught with a minimal example; a good one
passes and its run is recorded; what reaches the connector is counted by the connector itself.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conformance.check import check_connector
from conformance.listing import RESULTS_FOLDER, tier_of_run
from reconciler.cli import main as handler
from tests.conformance.shout_tree import TOOLS, binding_name, write_shout_tree
from tests.fixtures.vendor_trees import passing_check


@pytest.fixture
def shout(tmp_path: Path) -> Path:
    return write_shout_tree(tmp_path / "tree", count=True)


def items_of(path: Path) -> dict[str, dict[str, Any]]:
    return {item["nodeid"].split("::")[1]: item for item in json.loads(path.read_text())["items"]}


def test_a_good_connector_passes_and_the_run_is_recorded(shout: Path, tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    result, junit = tmp_path / "result.json", tmp_path / "junit.xml"
    code = check_connector("shout", "shout-good", root=shout, examples=10, seed=11, json_path=str(result),
                           junit=str(junit))
    out = capfd.readouterr().out
    assert code == 0, out
    assert "[100%]" in out
    assert "PASS shout/v1: cases 3/3 passed" in out
    assert "shout on shout/v1: passes (this run supports the tier 'fuzzed')" in out
    doc = json.loads(result.read_text())
    assert doc["passed"]
    assert doc["complete"]
    assert doc["seed"] == 11
    items = items_of(result)
    assert set(items) == {"case[shouts]", "case[nothing to shout]", "case[reads a file]", "fuzz[shout_text]",
                          "refuse[shout_text]", "fuzz[shout_file]", "refuse[shout_file]"}
    assert all(item["outcome"] == "passed" and item["duration"] > 0 for item in items.values())
    assert items["fuzz[shout_text]"]["details"]["examples"] == 10
    cases = list(ET.parse(junit).getroot().iter("testcase"))  # noqa: S314 - the report this test just wrote
    assert len(cases) == 7
    recorded = json.loads((shout / RESULTS_FOLDER / "shout.json").read_text())["runs"]
    assert len(recorded) == 1
    assert tier_of_run(recorded[0]["interfaces"]["shout/v1"]) == "fuzzed"


def test_only_valid_inputs_reach_the_connector(shout: Path, tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    log = tmp_path / "connector.log"  # the connector's own stderr: a line per call it received
    assert check_connector("shout", "shout-good", root=shout, examples=8, seed=2, json_path=str(result),
                           record=False, connector_log=str(log)) == 0
    items = items_of(result)
    refused = sum(i["details"]["invalid_inputs"] for n, i in items.items() if n.startswith("refuse["))
    valid = 3 + sum(i["details"]["examples"] for n, i in items.items() if n.startswith("fuzz["))
    received = [line for line in log.read_text().splitlines() if "received: " in line]
    assert refused > 10
    assert len(received) == valid  # the cases and the generated valid inputs; not one of the invalid ones


def is_non_ascii_char(text: str) -> bool:
    return len(text) == 1 and ord(text) > 127


@pytest.mark.parametrize(("mode", "says", "minimal"), [
    ("extra_field", ["'debug' was unexpected", "schema: /additionalProperties", '"debug": "left in by mistake"'],
     lambda text: text == "0"),
    ("bad_code", ["'too_long', which shout/v1 does not declare"], lambda text: text == "0" * 21),
    ("crash_non_ascii", ["connector crashed"], is_non_ascii_char),
    ("hang_long", ["exceeded the time limit"], lambda text: text == "0" * 41),
], ids=["adds-a-field", "undeclared-error", "crashes-on-non-ascii", "hangs-on-long-input"])
def test_a_broken_connector_is_caught_with_a_minimal_example(tmp_path: Path, mode: str, says: list[str],
                                                             minimal: Any, capfd: pytest.CaptureFixture[str]) -> None:
    # Each hanging example costs the time limit: a short one keeps the shrinking quick.
    root = write_shout_tree(tmp_path / "tree", timeout=0.5 if mode == "hang_long" else 5.0)
    result = tmp_path / "result.json"
    code = check_connector("shout", binding_name(mode), root=root, examples=40, seed=5, json_path=str(result),
                           select="fuzz and shout_text")
    out = capfd.readouterr().out
    assert code == 1, out
    item = items_of(result)["fuzz[shout_text]"]
    assert item["outcome"] == "failed"
    assert minimal(item["example"]["text"]), item["example"]
    for text in says:
        assert text in item["message"], item["message"]
    assert f"replay: handler connector check shout --binding {binding_name(mode)} --seed 5 --examples 40 " \
           "-k 'fuzz and shout_text'" in out
    assert "not recorded: a partial run" in out


def test_a_connector_that_dies_at_start_is_reported_with_what_it_said(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    root = write_shout_tree(tmp_path / "tree")
    (root / "catalog/connectors/shout/main.py").write_text(
        "import sys\nprint('shout: cannot load libshout.so.1', file=sys.stderr)\nsys.exit(3)\n")
    result = tmp_path / "result.json"
    assert check_connector("shout", "shout-good", root=root, examples=3, seed=1, json_path=str(result),
                           select="case") == 1
    capfd.readouterr()
    message = next(iter(items_of(result).values()))["message"]
    assert "the connector did not start" in message
    assert "the last of its stderr:\n    shout: cannot load libshout.so.1" in message


def test_2020_12_keywords_the_fuzzer_cannot_honour_are_reported(tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    tools = json.loads(json.dumps(TOOLS))
    tools[0]["inputSchema"]["properties"]["pair"] = {"type": "array", "prefixItems": [{"type": "string"}],
                                                     "items": False}
    root = write_shout_tree(tmp_path / "tree", tools=tools)
    result = tmp_path / "result.json"
    assert check_connector("shout", "shout-good", root=root, examples=5, seed=1, json_path=str(result),
                           select="fuzz") == 0
    out = capfd.readouterr().out
    assert "not fuzzed as written: shout_text: 'prefixItems' at /properties/pair" in out
    assert json.loads(result.read_text())["interfaces"]["shout/v1"]["not_honoured"] == [
        "shout_text: 'prefixItems' at /properties/pair"]


def test_a_partial_run_passes_on_what_it_ran_and_is_not_recorded(shout: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    assert check_connector("shout", "shout-good", root=shout, examples=3, seed=1, select="case") == 0
    out = capfd.readouterr().out
    assert "shout on shout/v1: 3 of 3 items run passed (a partial run)" in out
    assert not (shout / RESULTS_FOLDER).exists()


def test_misnamed_connector_or_binding_gets_did_you_mean(shout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert handler(["connector", "check", "shuot", "--binding", "shout-good", "--root", str(shout)]) == 2
    err = capsys.readouterr().err
    assert "no connector 'shuot'" in err
    assert "did you mean 'shout'?" in err
    assert handler(["connector", "check", "shout", "--binding", "shout-gods", "--root", str(shout)]) == 2
    err = capsys.readouterr().err
    assert "no binding 'shout-gods'" in err
    assert "did you mean 'shout-good'?" in err


@pytest.mark.skipif(not (shutil.which("tesseract") and shutil.which("pdftoppm")),
                    reason="tesseract-ocr and poppler-utils are not installed (.ci/run installs them)")
def test_ocr_tesseract_implements_ocr_v1(shipped_tree: Path, tmp_path: Path,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    summary = passing_check("ocr-tesseract", "ocr-local", shipped_tree, "ocr/v1", examples=15, seed=4,
                            result=tmp_path / "result.json", capfd=capfd)
    assert summary["cases"]["passed"] == 4  # the page drawn afresh among them
    assert summary["fuzzing_pass"]
