"""The gate behind the listing: CI checks again what changed, egress included, and refuses a result file the
runner did not produce — run here as the workflow runs it (its `.ci/recheck` script, on a clean clone)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from conformance.listing import RESULTS_FOLDER, read_results, results_text
from conformance.rechecks import STAND_IN, Recheck, changed_connectors
from reconciler.cli import main as handler
from tests.conformance.shout_tree import write_shout_tree

# Each test runs the workflow's checks for real (several connector checks, each under xdist); on a busy shared
# host that takes minutes, not the default two.
pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
RECHECK = REPO / ".ci/recheck"


def workflow_env(reports: Path) -> dict[str, str]:
    """The workflow's environment: `handler` and `python` are this venv's; reports kept out of the tree."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "REPORTS": str(reports)}


def run_workflow_steps(clone: Path, base: str, tmp: Path) -> tuple[str, int, subprocess.CompletedProcess[str]]:
    """The catalog workflow's three steps, in `clone`: which connectors changed, check them again into reruns/,
    then `catalog build --check --base --reruns`. (what changed, the recheck's exit code, the gate's result)."""
    env = workflow_env(tmp / "reports")
    changed = subprocess.run(["handler", "catalog", "changed", "--base", base], cwd=clone, env=env,
                             capture_output=True, text=True, check=True).stdout
    (clone / "changed.txt").write_text(changed)
    recheck = subprocess.run(["bash", str(RECHECK), "changed.txt", "reruns"], cwd=clone, env=env,
                             capture_output=True, text=True, check=False)
    gate = subprocess.run(["handler", "catalog", "build", "--check", "--base", base, "--reruns", "reruns"],
                          cwd=clone, env=env, capture_output=True, text=True, check=False)
    return changed, recheck.returncode, gate


def committed_origin(tmp: Path, git: Callable[..., str]) -> tuple[Path, str]:
    origin = write_shout_tree(tmp / "origin")
    assert handler(["catalog", "build", "--root", str(origin)]) == 0
    git(origin, "init", "-q")
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "base")
    return origin, git(origin, "rev-parse", "HEAD").strip()


def check(origin: Path, binding: str, seed: int) -> int:
    return handler(["connector", "check", "shout", "--binding", binding, "--root", str(origin), "--seed", str(seed),
                    "--examples", "5"])


def test_a_pass_written_by_hand_fails_the_gate_on_a_clean_clone(tmp_path: Path, git: Callable[..., str],
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """The runner's own failing run, turned into a pass in the runner's exact form: only a re-run shows it."""
    origin, base = committed_origin(tmp_path, git)
    assert check(origin, "shout-bad-code", 5) == 1
    path = origin / RESULTS_FOLDER / "shout.json"
    runs = read_results(path)
    summary = runs[-1]["interfaces"]["shout/v1"]
    runs[-1]["passed"] = summary["cases_pass"] = summary["fuzzing_pass"] = True
    summary["fuzz"] = {"failed": 0, "passed": 1, "skipped": 0}
    path.write_text(results_text("shout", runs))  # byte for byte what the runner would have written
    assert handler(["catalog", "build", "--root", str(origin)]) == 0
    assert json.loads((origin / "catalog/listing.json").read_text())["interfaces"]["shout/v1"][0]["tier"] == "fuzzed"
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "a pass written by hand")
    capfd.readouterr()

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    changed, rechecked, gate = run_workflow_steps(clone, base, tmp_path)

    assert changed == "shout shout-bad-code 5:5\n"  # the run the file gained, with its binding, seed and examples
    assert rechecked == 0  # the check ran: the connector failed it again (a warning), the gate judges the claim
    assert gate.returncode == 1, gate.stdout
    assert "catalog/results/shout.json: the run of" in gate.stdout
    assert "is not what the re-run here with its seed gave: the file says shout/v1 cases 3/3 pass, fuzzing passes; " \
           "the re-run shout/v1 cases 3/3 pass, fuzzing fails" in gate.stdout


def test_the_runners_own_runs_pass_the_gate_on_a_clean_clone(tmp_path: Path, git: Callable[..., str]) -> None:
    origin, base = committed_origin(tmp_path, git)
    for seed in (1, 2, 3):
        assert check(origin, "shout-good", seed) == 0
    assert handler(["catalog", "build", "--root", str(origin)]) == 0
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "three runs")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))

    changed, rechecked, gate = run_workflow_steps(clone, base, tmp_path)

    assert changed == "shout shout-good 1:5,2:5,3:5\n"
    assert rechecked == 0
    assert gate.returncode == 0, gate.stdout
    assert [r["seed"] for r in read_results(clone / "reruns/shout.json")] == [1, 2, 3]
    assert git(clone, "status", "--porcelain", RESULTS_FOLDER) == ""  # the re-runs never write the tree's results


def test_a_run_not_re_run_here_fails_the_gate(tmp_path: Path, git: Callable[..., str]) -> None:
    origin, base = committed_origin(tmp_path, git)
    assert check(origin, "shout-good", 9) == 0
    assert handler(["catalog", "build", "--root", str(origin)]) == 0
    empty = tmp_path / "reruns"
    empty.mkdir()
    code = handler(["catalog", "build", "--check", "--root", str(origin), "--base", base, "--reruns", str(empty)])
    assert code == 1


@pytest.mark.parametrize(("edit", "code", "says"), [
    (lambda text: text.replace('  "runs"', '"runs"'), 1, "not in the form `handler connector check` writes it"),
    (lambda text: text.replace('"seed": 9,', '"seed": 9, "note": "checked by hand",'), 1,
     "not in the form `handler connector check` writes it"),
    (lambda text: "{not json", 2, "shout.json: not a readable result file"),
])
def test_a_result_file_not_in_the_runners_form_fails_the_gate(tmp_path: Path, edit: Callable[[str], str], code: int,
                                                               says: str, capsys: pytest.CaptureFixture[str]) -> None:
    tree = write_shout_tree(tmp_path / "tree")
    assert check(tree, "shout-good", 9) == 0
    assert handler(["catalog", "build", "--root", str(tree)]) == 0
    assert handler(["catalog", "build", "--check", "--root", str(tree)]) == 0
    path = tree / RESULTS_FOLDER / "shout.json"
    path.write_text(edit(path.read_text()))
    capsys.readouterr()
    assert handler(["catalog", "build", "--check", "--root", str(tree)]) == code
    said = capsys.readouterr()
    assert says in said.out + said.err


def claim_a_run(tree: Path, connector: str, seed: int) -> dict[str, Any]:
    """A run added to `connector`'s result file: its newest, with another seed (a claim CI must reproduce)."""
    path = tree / RESULTS_FOLDER / f"{connector}.json"
    runs = read_results(path)
    claimed = {**runs[-1], "seed": seed, "started": "2026-12-04T00:00:00Z"}
    path.write_text(results_text(connector, [*runs, claimed]))
    return claimed


def test_the_workflow_rechecks_a_connector_with_egress_when_its_results_file_changes(
        shipped_tree: Path, tmp_path: Path, git: Callable[..., str]) -> None:
    """Only embed-openai's result file changed: it is named, checked against its stand-in with the claimed seed
    (the test suite's stand-in check, recording into the workflow's own folder), and the gate compares."""
    shutil.copytree(REPO / RESULTS_FOLDER, shipped_tree / RESULTS_FOLDER, dirs_exist_ok=True)
    assert handler(["catalog", "build", "--root", str(shipped_tree)]) == 0
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-q", "-m", "base")
    base = git(shipped_tree, "rev-parse", "HEAD").strip()
    claimed = claim_a_run(shipped_tree, "embed-openai", 11)
    assert handler(["catalog", "build", "--root", str(shipped_tree)]) == 0
    git(shipped_tree, "commit", "-q", "-am", "a run of embed-openai")

    assert changed_connectors(shipped_tree, base) == [Recheck("embed-openai", STAND_IN, ((11, claimed["examples"]),))]
    (tmp_path / "changed.txt").write_text(f"embed-openai {STAND_IN} 11:{claimed['examples']}\n")
    env = workflow_env(tmp_path / "reports")
    # The recheck runs from the repository, where the stand-in checks live, as the workflow's checkout does.
    done = subprocess.run(["bash", str(RECHECK), str(tmp_path / "changed.txt"), str(tmp_path / "reruns")], cwd=REPO,
                          env=env, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    redone = read_results(tmp_path / "reruns/embed-openai.json")
    assert [(r["seed"], r["evidence"]) for r in redone] == [(11, "stand-in")]
    assert handler(["catalog", "build", "--check", "--root", str(shipped_tree), "--base", base,
                    "--reruns", str(tmp_path / "reruns")]) == 0
    assert handler(["catalog", "build", "--check", "--root", str(shipped_tree), "--base", base,
                    "--reruns", str(tmp_path / "nothing")]) == 1  # the same claim, not re-run: refused


def test_changed_connectors_are_named_with_a_binding(tmp_path: Path, git: Callable[..., str]) -> None:
    tree = write_shout_tree(tmp_path / "tree")
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "base")
    assert changed_connectors(tree, "HEAD") == []
    (tree / "catalog/interfaces/shout/v1/conformance/hello.txt").write_text("hello again")
    assert changed_connectors(tree, "HEAD") == [Recheck("shout", "shout-bad-code")]


def test_a_change_to_the_kit_names_the_connectors_written_on_it(tmp_path: Path, git: Callable[..., str]) -> None:
    tree = write_shout_tree(tmp_path / "tree")
    (tree / "kit/handler_kit").mkdir(parents=True)
    (tree / "kit/handler_kit/__init__.py").write_text('"""the kit"""\n')
    main = tree / "catalog/connectors/shout/main.py"
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "base")
    (tree / "kit/handler_kit/__init__.py").write_text('"""the kit, changed"""\n')
    assert changed_connectors(tree, "HEAD") == []  # shout does not import the kit
    main.write_text("from handler_kit import serve  # written on the kit\n" + main.read_text())
    git(tree, "commit", "-q", "-am", "shout on the kit")
    assert changed_connectors(tree, "HEAD") == []  # the kit as committed
    (tree / "kit/handler_kit/__init__.py").write_text('"""the kit, changed again"""\n')
    assert changed_connectors(tree, "HEAD") == [Recheck("shout", "shout-bad-code")]


def test_a_connector_with_egress_is_named_to_be_checked_against_its_stand_in(repo_root: Path) -> None:
    named = {r.connector: r.binding for r in changed_connectors(repo_root, None)}
    assert named["embed-local"] == "embed-local"
    assert named["embed-openai"] == named["ocr-mistral"] == named["web-search-brave"] == STAND_IN
    assert named["web-fetch-mcp"] == "web-fetch-public"  # the check serves the pages its cases read
    assert "llm" not in named  # built into the router: no process to check; its own tests cover it


def test_the_catalog_workflow_rechecks_and_gates_on_the_reruns() -> None:
    workflow = yaml.safe_load((REPO / ".github/workflows/catalog.yml").read_text())
    steps = "\n".join(str(step.get("run", "")) for job in workflow["jobs"].values() for step in job["steps"])
    assert 'handler catalog changed --base "$BASE" > changed.txt' in steps
    assert "bash .ci/recheck changed.txt reruns" in steps
    assert 'handler catalog build --check --base "$BASE" --reruns reruns' in steps
    assert "HANDLER_STAND_IN_RESULTS: ${{ github.workspace }}/catalog/results" not in steps + str(workflow)


@pytest.mark.parametrize(("replays", "code", "level"), [("-", 0, "warning"), ("5:25", 1, "error")])
def test_a_connector_with_egress_and_no_stand_in_check_is_said_and_fails_when_it_claims_runs(
        tmp_path: Path, replays: str, code: int, level: str) -> None:
    (tmp_path / "changed.txt").write_text(f"ocr-mistral {STAND_IN} {replays}\n")
    done = subprocess.run(["bash", str(RECHECK), str(tmp_path / "changed.txt"), str(tmp_path / "reruns")], cwd=REPO,
                          env=workflow_env(tmp_path / "reports"), capture_output=True, text=True, check=False)
    assert done.returncode == code
    assert done.stdout.startswith(f"::{level}::ocr-mistral reaches a vendor and has no stand-in check "
                                  "(tests/catalog/test_ocr_mistral.py::test_connector_check_passes_against_the_stand_in)")
    assert not list((tmp_path / "reruns").iterdir())
