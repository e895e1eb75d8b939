"""The loader: immutable snapshots, resolution of selections, and the content-hash cache."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from unittest import mock

import pytest

from reconciler.config import FolderSource, Loader
from reconciler.config.checks import syntax


def test_shipped_tree_resolves_services_and_defaults(shipped_tree: Path) -> None:
    snapshot = Loader().load(FolderSource(shipped_tree))
    assert snapshot.ok, [f.render_text() for f in snapshot.findings]
    assistant = snapshot.profiles["assistant"]
    llm = assistant.selections["llm"]
    assert (llm.key, llm.binding, llm.origin) == ("llm/v2", "llm-openai", "org default")  # the highest version
    auditor = snapshot.profiles["auditor"].selections["ocr"]
    assert (auditor.key, auditor.pinned) == ("ocr/v1", True)


def test_snapshot_cannot_be_mutated(shipped_tree: Path) -> None:
    snapshot = Loader().load(FolderSource(shipped_tree))
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.revision = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.profiles["x"] = snapshot.profiles["assistant"]  # type: ignore[index]
    with pytest.raises(ValueError, match="frozen"):
        snapshot.profiles["assistant"].spec.pins = []  # type: ignore[misc]


def test_highest_version_is_taken_unless_pinned(shipped_tree: Path) -> None:
    v1 = shipped_tree / "catalog/interfaces/ocr/v1"
    v2 = shipped_tree / "catalog/interfaces/ocr/v2"
    v2.mkdir()
    (v2 / "tools.json").write_bytes((v1 / "tools.json").read_bytes())
    shutil.copytree(v1 / "skills", v2 / "skills")
    (v2 / "interface.toml").write_text((v1 / "interface.toml").read_text().replace("version = 1", "version = 2"))
    connector = shipped_tree / "catalog/connectors/ocr-tesseract/connector.toml"
    connector.write_text(connector.read_text().replace('implements = ["ocr/v1"]', 'implements = ["ocr/v1", "ocr/v2"]'))
    snapshot = Loader().load(FolderSource(shipped_tree))
    assert snapshot.ok, [f.render_text() for f in snapshot.findings]
    assert snapshot.profiles["researcher"].selections["ocr"].key == "ocr/v2"
    assert snapshot.profiles["auditor"].selections["ocr"].key == "ocr/v1"  # pinned "ocr/v1"


def test_reload_parses_only_the_changed_file(shipped_tree: Path) -> None:
    loader = Loader()
    source = FolderSource(shipped_tree)
    first = loader.load(source)
    binding = shipped_tree / "config/bindings/ocr-local.toml"
    binding.write_text(binding.read_text().replace("description =", 'description = "changed" #'))
    with (
        mock.patch.object(syntax.orjson, "loads", wraps=syntax.orjson.loads) as json_loads,
        mock.patch("reconciler.config.loading.parse_document", wraps=syntax.parse_document) as parse,
    ):
        second = loader.load(source)
    assert [c.args[0] for c in parse.call_args_list] == ["config/bindings/ocr-local.toml"]
    assert json_loads.call_count == 0
    assert second.bindings["ocr-local"].spec.description == "changed"
    # The unchanged interface is the same, built from the very objects the first load parsed.
    before, after = first.interfaces["ocr/v1"], second.interfaces["ocr/v1"]
    assert after == before
    assert after.spec is before.spec
    assert all(a is b for a, b in zip(after.tools, before.tools, strict=True))
    assert second.profiles["assistant"] is first.profiles["assistant"]  # none of its bindings changed
    assert second.profiles["auditor"] is not first.profiles["auditor"]  # it selects ocr-local


def test_unreadable_toml_is_a_finding_with_its_line(shipped_tree: Path) -> None:
    profile = shipped_tree / "config/profiles/researcher.toml"
    lines = profile.read_text().splitlines()
    lines.insert(2, 'template = "permissive')
    profile.write_text("\n".join(lines) + "\n")
    snapshot = Loader().load(FolderSource(shipped_tree))
    found = [(f.code, f.file, f.line) for f in snapshot.errors]
    assert ("F001", "config/profiles/researcher.toml", 3) in found
    assert "researcher" not in snapshot.profiles
