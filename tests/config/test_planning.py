"""The plan (`handler plan --base REF`): what changes for each profile between two revisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.cli import main


def test_plan_shows_a_binding_swap_and_nothing_otherwise(committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(committed), "--base", "HEAD"]) == 0
    assert capsys.readouterr().out.startswith("No changes")
    profile = committed / "config/profiles/researcher.toml"
    profile.write_text(profile.read_text().replace('"ocr-local"', '"ocr-mistral-perso"'))
    assert main(["plan", str(committed), "--base", "HEAD", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    [changed] = plan["profiles"]
    assert changed["profile"] == "researcher"
    assert changed["status"] == "changed"
    assert changed["after"]["services"]["ocr"]["binding"] == "ocr-mistral-perso"
    assert any(c.startswith("ocr: ocr-local (ocr/v1") and "→ ocr-mistral-perso" in c for c in changed["changes"])


def test_plan_shows_a_scope_change(committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profile's scope is what its agent's handler-file paths may reach: widening it is a change to review."""
    profile = committed / "config/profiles/researcher.toml"
    text = profile.read_text()
    old = text.split('scope = "', 1)[1].split('"', 1)[0]
    profile.write_text(text.replace(f'scope = "{old}"', 'scope = "/"'))
    assert main(["plan", str(committed), "--base", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "profile researcher (changed)" in out
    assert f'scope: "{old}" → "/"' in out


def test_plan_shows_a_connectors_needs_when_they_change(committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`[needs]` is run by `handler connector install` (package builds, setup commands): it is reviewed like code."""
    manifest = committed / "catalog/connectors/web-fetch-mcp/connector.toml"
    declared = '"mcp-server-fetch>=2025.1"'
    manifest.write_text(manifest.read_text().replace(declared, f'{declared}, "evil"'))
    assert main(["plan", str(committed), "--base", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "connector web-fetch-mcp needs" in out
    assert 'python = ["mcp-server-fetch>=2025.1", "evil"]' in out
    assert "setup = [" in out
    assert "embed-local" not in out  # unchanged: not shown again
    assert main(["plan", str(committed), "--base", "HEAD", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["needs"]["web-fetch-mcp"][0].startswith("python = ")
