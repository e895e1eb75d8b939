"""The catalog listing: built from result files only, tiers from the runs at the current revision, the CI gate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from conformance.listing import (
    LISTING_FILE,
    RESULTS_FOLDER,
    build_listing,
    changed_connectors,
    check_listing,
    record_run,
)
from reconciler.cli import main as handler
from reconciler.config import FolderSource, Loader
from tests.conformance.shout_tree import write_shout_tree

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write_shout_tree(tmp_path / "tree")


def run(tree: Path, *, seed: int, cases: bool = True, fuzzing: bool = True, connector_hash: str | None = None,
        started: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    """A check's JSON result as the plugin writes it, for the tree as it is now."""
    snapshot = Loader().load(FolderSource(tree))
    return {
        "format": "handler.conformance-run/v1", "connector": "shout", "binding": "shout-good", "started": started,
        "connector_hash": connector_hash or snapshot.connectors["shout"].content_hash, "seed": seed,
        "passed": cases and fuzzing, "complete": True, "items": [],
        "interfaces": {"shout/v1": {"interface_hash": snapshot.interfaces["shout/v1"].content_hash,
                                    "cases_pass": cases, "fuzzing_pass": fuzzing}},
    }


def listed(tree: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = build_listing(tree)["interfaces"]["shout/v1"]
    return entries


def test_no_result_no_listing(tree: Path) -> None:
    assert listed(tree) == []


@pytest.mark.parametrize(("runs", "tier"), [
    ([{"seed": 1}], "fuzzed"),
    ([{"seed": 1, "fuzzing": False}], "cases"),
    ([{"seed": 1, "cases": False}], None),
    ([{"seed": 1}, {"seed": 2}, {"seed": 3}], "repeated"),
    ([{"seed": 1}, {"seed": 1}, {"seed": 1}], "fuzzed"),  # the same seed thrice is one run's evidence
    ([{"seed": 1}, {"seed": 2}, {"seed": 3}, {"seed": 4, "fuzzing": False}], "cases"),  # the newest run counts
    ([{"seed": 1}, {"seed": 2, "fuzzing": False}, {"seed": 3}, {"seed": 4}], "fuzzed"),  # a streak, not a total
])
def test_the_tier_comes_from_the_newest_runs(tree: Path, runs: list[dict[str, Any]], tier: str | None) -> None:
    for index, spec in enumerate(runs):
        record_run(tree, run(tree, started=f"2026-01-0{index + 1}T00:00:00Z", **spec))
    assert [e["tier"] for e in listed(tree)] == ([tier] if tier else [])


def test_a_result_counts_only_while_the_files_hash_as_they_did(tree: Path) -> None:
    record_run(tree, run(tree, seed=1))
    assert listed(tree)
    cases = tree / "catalog/interfaces/shout/v1/conformance/cases.toml"
    cases.write_text(cases.read_text() + '\n[[case]]\nname = "new"\ntool = "shout_text"\ninput = { text = "a" }\n')
    assert listed(tree) == []  # a new case: the connector must be checked again
    record_run(tree, run(tree, seed=2, connector_hash="0" * 64))
    assert listed(tree) == []


def test_the_gate_fails_on_a_listing_the_results_do_not_support(tree: Path) -> None:
    record_run(tree, run(tree, seed=1, fuzzing=False))
    supported = build_listing(tree)
    assert check_listing(tree, supported) == ([], [])
    claims_more = json.loads(json.dumps(supported))
    claims_more["interfaces"]["shout/v1"][0]["tier"] = "fuzzed"
    errors, _ = check_listing(tree, claims_more)
    assert errors == [f"{LISTING_FILE}: shout/v1 lists 'shout' as 'fuzzed', but its results support 'cases'\n"
                      "  fix: handler catalog build"]
    claims_other = {"interfaces": {"shout/v1": [{"connector": "ghost", "tier": "cases"}]}}
    errors, notes = check_listing(tree, claims_other)
    assert "lists 'ghost' without a passing result at the current revision" in errors[0]
    assert notes == ["shout/v1: 'shout' qualifies as 'cases' but the listing says nothing; `handler catalog build` "
                     "updates it"]


def test_catalog_build_writes_the_listing_and_check_verifies_it(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert handler(["catalog", "build", "--root", str(tree), "--check"]) == 1  # no listing yet
    record_run(tree, run(tree, seed=1))
    assert handler(["catalog", "build", "--root", str(tree)]) == 0
    assert "shout/v1         shout (fuzzed)" in capsys.readouterr().out
    assert handler(["catalog", "build", "--root", str(tree), "--check"]) == 0
    (tree / "catalog/connectors/shout/PROVISIONING.md").write_text("# shout\n\nChanged.\n")
    assert handler(["catalog", "build", "--root", str(tree), "--check"]) == 1
    assert "lists 'shout' without a passing result at the current revision" in capsys.readouterr().out


def test_result_files_keep_the_last_runs_newest_last(tree: Path) -> None:
    for seed in range(12):
        record_run(tree, run(tree, seed=seed, started=f"2026-01-01T00:00:{seed:02d}Z"))
    runs = json.loads((tree / RESULTS_FOLDER / "shout.json").read_text())["runs"]
    assert [r["seed"] for r in runs] == list(range(2, 12))


def test_changed_connectors_are_named_with_a_binding(tree: Path, git: Callable[..., str]) -> None:
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "base")
    assert changed_connectors(tree, "HEAD") == []
    (tree / "catalog/interfaces/shout/v1/conformance/hello.txt").write_text("hello again")
    assert changed_connectors(tree, "HEAD") == [("shout", "shout-bad-code")]


def test_the_catalog_workflow_checks_changed_connectors_and_gates_the_listing() -> None:
    workflow = yaml.safe_load((REPO / ".github/workflows/catalog.yml").read_text())
    steps = "\n".join(str(step.get("run", "")) for job in workflow["jobs"].values() for step in job["steps"])
    assert "handler catalog changed --base" in steps
    assert "handler connector check" in steps
    assert "handler catalog build --check" in steps


def test_the_shipped_listing_is_supported_by_the_shipped_results() -> None:
    listing = json.loads((REPO / LISTING_FILE).read_text())
    errors, _ = check_listing(REPO, listing)
    assert errors == []
    assert any(e["connector"] == "ocr-tesseract" for e in listing["interfaces"]["ocr/v1"])
