"""The catalog listing: built from result files only, tiers from the runs at the current revision, the CI gate."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from conformance.check import evidence_of
from conformance.errors import CheckError
from conformance.listing import (
    EVIDENCE,
    LISTING_FILE,
    RESULTS_FOLDER,
    build_listing,
    check_listing,
    record_run,
)
from conformance.workspace import load_subject
from reconciler.cli import main as handler
from reconciler.config import FolderSource, Loader
from tests.conformance.shout_tree import write_shout_tree

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write_shout_tree(tmp_path / "tree")


def run(tree: Path, *, seed: int, cases: bool = True, fuzzing: bool = True, connector_hash: str | None = None,
        started: str = "2026-01-01T00:00:00Z", evidence: str = "local") -> dict[str, Any]:
    """A check's JSON result as the plugin writes it, for the tree as it is now."""
    snapshot = Loader().load(FolderSource(tree))
    return {
        "format": "handler.conformance-run/v1", "connector": "shout", "binding": "shout-good", "started": started,
        "connector_hash": connector_hash or snapshot.connectors["shout"].content_hash, "seed": seed,
        "passed": cases and fuzzing, "complete": True, "items": [], "evidence": evidence,
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


def test_a_measure_edited_in_the_listing_fails_the_gate(tree: Path) -> None:
    measured = run(tree, seed=1)
    measured["interfaces"]["shout/v1"]["measured"] = {"reads": {"text.wordErrorRate": 0.25}}
    record_run(tree, measured)
    listing = build_listing(tree)
    assert listing["interfaces"]["shout/v1"][0]["measured"] == {"reads": {"text.wordErrorRate": 0.25}}
    assert check_listing(tree, listing) == ([], [])
    listing["interfaces"]["shout/v1"][0]["measured"]["reads"]["text.wordErrorRate"] = 0.02
    errors, _ = check_listing(tree, listing)
    assert errors == [f"{LISTING_FILE}: shout/v1 shows for 'shout' measures its results do not hold "
                      "({'reads': {'text.wordErrorRate': 0.02}} against {'reads': {'text.wordErrorRate': 0.25}})\n"
                      "  fix: handler catalog build"]


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


def test_an_entry_takes_its_tier_and_evidence_from_runs_of_the_newest_evidence(tree: Path) -> None:
    for index, evidence in enumerate(["vendor", "vendor", "vendor", "stand-in"]):
        record_run(tree, run(tree, seed=index, started=f"2026-01-0{index + 1}T00:00:00Z", evidence=evidence))
    (entry,) = listed(tree)
    assert (entry["tier"], entry["evidence"]) == ("fuzzed", "stand-in")  # the vendor streak does not lift it
    record_run(tree, run(tree, seed=9, started="2026-01-09T00:00:00Z", evidence="vendor"))
    (entry,) = listed(tree)
    assert (entry["tier"], entry["evidence"]) == ("repeated", "vendor")


def test_a_stand_in_result_listed_as_vendor_fails_the_gate(tree: Path) -> None:
    record_run(tree, run(tree, seed=1, evidence="stand-in"))
    claims_vendor = build_listing(tree)
    claims_vendor["interfaces"]["shout/v1"][0]["evidence"] = "vendor"
    errors, _ = check_listing(tree, claims_vendor)
    assert errors == [f"{LISTING_FILE}: shout/v1 lists 'shout' with the evidence 'vendor', but its results are "
                      "'stand-in'\n  fix: handler catalog build"]


def test_a_run_without_evidence_counts_for_nothing(tree: Path) -> None:
    document = run(tree, seed=1)
    del document["evidence"]
    record_run(tree, document)
    assert listed(tree) == []
    assert build_listing(tree)["connectors"]["shout"] == {"checked": None}


def test_the_last_check_of_each_connector_failed_or_not_is_in_the_listing(tree: Path) -> None:
    record_run(tree, run(tree, seed=1, started="2026-01-01T00:00:00Z"))
    record_run(tree, run(tree, seed=2, cases=False, started="2026-01-02T00:00:00Z"))
    listing = build_listing(tree)
    assert listing["connectors"]["shout"] == {"checked": "2026-01-02T00:00:00Z", "passed": False,
                                              "evidence": "local", "binding": "shout-good", "commit": None,
                                              "current": True, "measured": {}}
    assert listed(tree) == []
    listing["connectors"]["shout"]["passed"] = True
    errors, _ = check_listing(tree, listing)
    assert "says connector 'shout' passed its last check, but its last recorded check did not" in errors[0]


def test_the_shipped_listing_is_supported_by_the_shipped_results() -> None:
    listing = json.loads((REPO / LISTING_FILE).read_text())
    errors, _ = check_listing(REPO, listing)
    assert errors == []
    assert any(e["connector"] == "ocr-tesseract" for e in listing["interfaces"]["ocr/v1"])
    assert {"connector": "embed-local", "evidence": "local"}.items() <= listing["interfaces"]["embed/v1"][0].items()
    snapshot = Loader().load(FolderSource(REPO))
    for entries in listing["interfaces"].values():
        for entry in entries:  # nothing shipped was checked with real credentials: no entry may say vendor
            egress = snapshot.connectors[entry["connector"]].spec.egress
            assert entry["evidence"] == ("stand-in" if egress else "local"), entry


def test_catalog_with_no_action_lists_each_interface_with_its_connectors_tier_and_evidence(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("HANDLER_ROOT", raising=False)
    assert handler(["catalog"]) == 0  # no action named: the list, not a usage error
    alone = capsys.readouterr().out
    assert handler(["catalog", "list", "--root", str(REPO)]) == 0
    assert alone == capsys.readouterr().out
    lines = alone.splitlines()
    ocr = lines[lines.index("ocr/v1") + 1:]
    assert re.match(r"  ocr-tesseract +\S+ +local", next(line for line in ocr if "ocr-tesseract" in line))


LOOPBACK_BINDING = """apiVersion = "handler.binding/v1"
name = "embed-stand-in"
connector = "embed-openai"
settings = { base_url = "http://127.0.0.1:8080", model = "m" }
egress = ["127.0.0.1:8080"]

[pricing]
embed_texts = 0.001
"""


@pytest.mark.parametrize(("connector", "binding", "asked", "evidence"), [
    ("embed-local", "embed-local", None, "local"),
    ("embed-local", "embed-local", "vendor", "reaches no network (egress = []): its evidence is local, not vendor"),
    ("embed-openai", "embed-openai", None, "stand-in"),  # the least a run can claim
    ("embed-openai", "embed-openai", "vendor", "vendor"),
    ("embed-openai", "embed-openai", "local", "reaches beyond this machine (api.openai.com:443)"),
    ("embed-openai", "embed-stand-in", None, "stand-in"),
    ("embed-openai", "embed-stand-in", "local", "local"),  # a real engine on this machine, e.g. Ollama
    ("embed-openai", "embed-stand-in", "vendor", "reaches only loopback (127.0.0.1:8080): a stand-in or a local"),
])
def test_the_evidence_a_check_records(shipped_tree: Path, connector: str, binding: str, asked: str | None,
                                      evidence: str) -> None:
    (shipped_tree / "config/bindings/embed-stand-in.toml").write_text(LOOPBACK_BINDING)
    subject = load_subject(shipped_tree, connector, binding)
    if evidence in EVIDENCE:
        assert evidence_of(subject, asked) == evidence
    else:
        with pytest.raises(CheckError, match=re.escape(evidence)):
            evidence_of(subject, asked)


@pytest.mark.timeout(600)  # two full checks, each hearing ten sentences back
@pytest.mark.skipif(shutil.which("text2wave") is None or shutil.which("espeak-ng") is None,
                    reason="Festival or eSpeak NG is not installed (CI installs both: .ci/packages)")
def test_catalog_list_shows_espeak_below_festival_with_the_round_trip_word_error(
        shipped_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A full check of both voices (their sentences drawn afresh, heard back by PocketSphinx): Festival is listed,
    eSpeak NG, which the recognizer cannot follow, is not, and each line shows the round trip's word error."""
    assert handler(["connector", "install", "transcribe-pocketsphinx", "--root", str(REPO)]) == 0
    shutil.rmtree(shipped_tree / RESULTS_FOLDER, ignore_errors=True)
    for connector, binding in (("tts-festival", "tts-festival-local"), ("tts-espeak", "tts-local")):
        handler(["connector", "check", connector, "--binding", binding, "--root", str(shipped_tree),
                 "--examples", "3"])
    capsys.readouterr()
    assert handler(["catalog", "list", "--root", str(shipped_tree)]) == 0
    shown = capsys.readouterr().out.splitlines()
    tts = shown[shown.index("tts/v1") + 1:][:2]
    print("\n".join(tts))
    festival, espeak = tts
    assert re.match(r"  tts-festival +fuzzed +local +round-trip word error (\d+\.\d)% \(sentences drawn afresh",
                    festival)
    assert re.match(r"  tts-espeak +- +local +round-trip word error (\d+\.\d)% .*\(failed its last check\)$", espeak)
    rates = [float(re.findall(r"(\d+\.\d)%", line)[0]) for line in (festival, espeak)]
    assert rates[0] <= 40 < rates[1]
