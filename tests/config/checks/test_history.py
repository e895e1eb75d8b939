"""checks.history: a published version is frozen; `handler validate --base REF` names the one to create (I010)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reconciler.cli import main


def _validate(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main(["validate", str(root), "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_editing_a_published_tool_is_refused_with_the_next_version(
    committed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = committed / "catalog/interfaces/ocr/v1/tools.json"
    data = json.loads(tools.read_text())
    data[0]["inputSchema"]["properties"]["dpi"] = {"type": "integer"}  # "just an optional field"
    tools.write_text(json.dumps(data, indent=2))
    code, report = _validate(committed, capsys, "--base", "HEAD")
    assert code == 1
    findings = report["findings"]
    assert isinstance(findings, list)
    [finding] = findings
    assert finding["code"] == "I010"
    assert finding["file"] == "catalog/interfaces/ocr/v1/tools.json"
    lines = tools.read_text().splitlines()
    assert '"dpi"' in lines[finding["line"] - 1]
    assert "ocr/v2" in finding["fix"]


def test_skill_change_is_refused_but_new_cases_are_not(committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = committed / "catalog/interfaces/ocr/v1/conformance/cases.toml"
    cases.write_text(
        cases.read_text() + '\n[[case]]\nname = "png too"\ntool = "ocr_extract"\n'
        'input = { path = "invoice.png" }\nexpect.contains = ["Total"]\n'
    )
    assert _validate(committed, capsys, "--base", "HEAD")[0] == 0
    skill = committed / "catalog/interfaces/ocr/v1/skills/ocr/SKILL.md"
    skill.write_text(skill.read_text() + "\nAlways retry twice.\n")
    code, report = _validate(committed, capsys, "--base", "HEAD")
    assert code == 1
    assert [(f["code"], f["file"]) for f in report["findings"]] == [  # type: ignore[attr-defined]
        ("I010", "catalog/interfaces/ocr/v1/skills/ocr/SKILL.md")
    ]


def test_a_new_version_is_not_frozen_until_it_exists_at_the_base(
    committed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v1 = committed / "catalog/interfaces/ocr/v1"
    v2 = committed / "catalog/interfaces/ocr/v2"
    v2.mkdir()
    (v2 / "tools.json").write_bytes((v1 / "tools.json").read_bytes())
    shutil.copytree(v1 / "skills", v2 / "skills")
    (v2 / "interface.toml").write_text((v1 / "interface.toml").read_text().replace("version = 1", "version = 2"))
    assert _validate(committed, capsys, "--base", "HEAD")[0] == 0


def test_a_published_versions_cases_and_fixtures_may_not_be_removed_or_weakened(
    committed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One case asserting minItems = 0 in place of three validated: the quality floor was lowered in place."""
    folder = committed / "catalog/interfaces/ocr/v1/conformance"
    cases = folder / "cases.toml"
    original = cases.read_text()
    cases.write_text(original.replace('expect.contains = ["INV-2024-0042", "Total"]', 'expect.contains = ["INV"]', 1))
    (folder / "invoice.png").write_bytes(b"not the invoice")
    code, report = _validate(committed, capsys, "--base", "HEAD")
    assert code == 1
    assert sorted((f["file"], f["message"].split(" and its conformance ")[1])  # type: ignore[index]
                  for f in report["findings"]) == [  # type: ignore[attr-defined]
        ("catalog/interfaces/ocr/v1/conformance/cases.toml", "case 'invoice text' was changed"),
        ("catalog/interfaces/ocr/v1/conformance/invoice.png", "fixture invoice.png was changed")]
    head, tail = original.split('[[case]]\nname = "rejects a zip"')
    cases.write_text(head + tail[tail.find("\n[[case]]") + 1:] if "\n[[case]]" in tail else head)
    (folder / "invoice.png").write_bytes(_committed_bytes(committed, "invoice.png"))
    code, report = _validate(committed, capsys, "--base", "HEAD")
    assert code == 1
    assert [f["message"].split(" and its conformance ")[1]  # type: ignore[index]
            for f in report["findings"]] == ["case 'rejects a zip' was removed"]  # type: ignore[attr-defined]


def _committed_bytes(root: Path, name: str) -> bytes:
    import subprocess

    return subprocess.run(["git", "show", f"HEAD:catalog/interfaces/ocr/v1/conformance/{name}"], cwd=root,
                          capture_output=True, check=True).stdout
