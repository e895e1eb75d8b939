"""A tree read from a folder and from a git commit loads to the same snapshot."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.config import FolderSource, GitSource, Loader, SourceError


def test_folder_and_commit_give_equal_snapshots(shipped_tree: Path, git: Callable[..., str]) -> None:
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", "tree")
    from_folder = Loader().load(FolderSource(shipped_tree))
    from_commit = Loader().load(GitSource(shipped_tree, "HEAD"))
    assert from_folder.ok
    assert from_commit.ok
    assert from_commit.revision == git(shipped_tree, "rev-parse", "HEAD")
    assert from_folder == from_commit
    ocr = from_commit.interfaces["ocr/v1"]
    assert (
        ocr.fixtures["invoice.pdf"] == (shipped_tree / "catalog/interfaces/ocr/v1/conformance/invoice.pdf").read_bytes()
    )
    assert ocr.content_hash == from_folder.interfaces["ocr/v1"].content_hash


def test_commit_is_read_from_its_tree_not_the_checkout(shipped_tree: Path, git: Callable[..., str]) -> None:
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", "tree")
    (shipped_tree / "config/bindings/ocr-local.toml").write_text("not = [valid toml\n")
    assert not Loader().load(FolderSource(shipped_tree)).ok
    assert Loader().load(GitSource(shipped_tree, "HEAD")).ok


def test_tree_in_a_subfolder_of_the_repository(shipped_tree: Path, git: Callable[..., str]) -> None:
    outer = shipped_tree.parent
    git(outer, "init", "-q")
    git(outer, "add", "-A")
    git(outer, "commit", "-qm", "tree")
    snapshot = Loader().load(GitSource.for_folder(shipped_tree, "HEAD"))
    assert snapshot.ok
    assert set(snapshot.profiles) == {"assistant", "auditor", "researcher"}


def test_unknown_ref_and_missing_repository_are_source_errors(shipped_tree: Path, git: Callable[..., str]) -> None:
    with pytest.raises(SourceError, match="not inside a git repository"):
        GitSource(shipped_tree, "HEAD")
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", "tree")
    with pytest.raises(SourceError, match="'no-such-branch' is not a commit"):
        Loader().load(GitSource(shipped_tree, "no-such-branch"))
    with pytest.raises(SourceError, match="is not a folder"):
        FolderSource(shipped_tree / "missing").read()


def test_noted_changes_are_read_alone_and_give_what_a_full_walk_gives(shipped_tree: Path) -> None:
    source = FolderSource(shipped_tree)
    source.read()
    binding = shipped_tree / "config/bindings/ocr-local.toml"
    binding.write_text(binding.read_text().replace("description =", 'description = "noted" #'))
    removed = shipped_tree / "config/bindings/llm-anthropic.toml"
    removed.unlink()
    added = shipped_tree / "catalog/interfaces/ocr/v1/conformance/extra.txt"
    added.write_text("new fixture")
    source.note_changes([binding, removed, added, shipped_tree / "README.md"])
    revision, files = source.read()
    assert files["config/bindings/ocr-local.toml"].data == binding.read_bytes()
    assert "config/bindings/llm-anthropic.toml" not in files
    assert files["catalog/interfaces/ocr/v1/conformance/extra.txt"].data == b"new fixture"
    assert (revision, files) == FolderSource(shipped_tree).read()


def test_a_removed_folder_or_an_old_walk_falls_back_to_a_full_walk(shipped_tree: Path) -> None:
    source = FolderSource(shipped_tree)
    source.read()
    folder = shipped_tree / "catalog/interfaces/tts"
    shutil.rmtree(folder)
    source.note_changes([folder])
    assert not any(p.startswith("catalog/interfaces/tts/") for p in source.read()[1])

    unnoted = shipped_tree / "config/profiles/auditor.toml"
    unnoted.write_text(unnoted.read_text() + "# unnoted\n")
    source.note_changes([])
    source.FULL_WALK_SECONDS = 0.0  # the periodic full walk is due: what the watcher missed is seen
    assert source.read()[1]["config/profiles/auditor.toml"].data.endswith(b"# unnoted\n")


def test_a_symbolic_link_is_refused_by_name_from_a_folder_and_from_a_commit(shipped_tree: Path,
                                                                             git: Callable[..., str]) -> None:
    outside = shipped_tree.parent / "elsewhere.toml"
    outside.write_text((shipped_tree / "config/bindings/ocr-local.toml").read_text().replace("ocr-local", "linked"))
    (shipped_tree / "config/bindings/linked.toml").symlink_to(outside)
    (shipped_tree / "catalog/connectors/ocr-tesseract/helper.py").symlink_to("/etc/hostname")
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", "tree with links")
    for source in (FolderSource(shipped_tree), GitSource(shipped_tree, "HEAD")):
        snapshot = Loader().load(source)
        assert not snapshot.ok
        refused = {f.file: f.message for f in snapshot.findings if f.code == "F006"}
        assert set(refused) == {"config/bindings/linked.toml", "catalog/connectors/ocr-tesseract/helper.py"}
        assert f"to {outside}" in refused["config/bindings/linked.toml"]
        assert "linked" not in snapshot.bindings  # the file it points to is never read


def test_a_link_made_in_a_watched_folder_changes_its_revision(shipped_tree: Path) -> None:
    source = FolderSource(shipped_tree)
    before, _ = source.read()
    link = shipped_tree / "config/profiles/copy.toml"
    link.symlink_to(shipped_tree / "config/profiles/auditor.toml")
    source.note_changes([link])
    revision, files = source.read()
    assert revision != before
    assert files["config/profiles/copy.toml"].link
    assert (revision, files) == FolderSource(shipped_tree).read()
    assert [f.code for f in Loader().load(source).findings if f.severity.value == "error"] == ["F006"]


@pytest.mark.parametrize("folder", ["config", "catalog", "catalog/connectors"])
def test_a_tree_folder_that_is_a_link_is_refused_not_followed_or_crashed_on(
        shipped_tree: Path, tmp_path: Path, git: Callable[..., str], folder: str) -> None:
    real = tmp_path / "real"
    shutil.move(shipped_tree / folder, real)
    (shipped_tree / folder).symlink_to(real)
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", f"{folder} elsewhere")
    for source in (FolderSource(shipped_tree), GitSource(shipped_tree, "HEAD")):
        snapshot = Loader().load(source)
        assert ("F006", folder) in [(f.code, f.file) for f in snapshot.findings if f.severity.value == "error"]
        assert not snapshot.ok


def test_a_watched_folder_swapped_for_a_link_leaves_none_of_its_files_behind(shipped_tree: Path,
                                                                            tmp_path: Path) -> None:
    source = FolderSource(shipped_tree)
    source.read()
    bindings = shipped_tree / "config/bindings"
    shutil.move(bindings, tmp_path / "bindings")
    bindings.symlink_to(tmp_path / "bindings")
    source.note_changes([bindings])  # the watcher saw the link made, not each file go
    revision, files = source.read()
    assert not any(path.startswith("config/bindings/") for path in files)
    assert files["config/bindings"].link
    assert (revision, files) == FolderSource(shipped_tree).read()


def test_a_file_name_not_utf8_is_a_finding_naming_it_from_a_folder_and_from_a_commit(
        shipped_tree: Path, git: Callable[..., str], capsys: pytest.CaptureFixture[str]) -> None:
    (shipped_tree / "catalog/connectors/ocr-tesseract" / os.fsdecode(b"bad\xff\xfe")).write_text("x")
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", "a file named in Latin-1")
    for source in (FolderSource(shipped_tree), GitSource(shipped_tree, "HEAD")):
        snapshot = Loader().load(source)
        assert snapshot.revision
        assert [(f.code, f.file) for f in snapshot.findings] == [
            ("F008", "catalog/connectors/ocr-tesseract/bad\\xff\\xfe")]
    for form in ("text", "json", "github"):
        assert main(["validate", str(shipped_tree), "--format", form]) == 1
        out = capsys.readouterr().out
        assert "bad\\xff\\xfe" in (json.loads(out)["findings"][0]["file"] if form == "json" else out)


def test_a_file_over_the_size_a_tree_file_may_be_is_a_finding_and_is_not_read(
        shipped_tree: Path, git: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A blob of zeros that a few MB of repository hold took ~900 MB of memory to validate, and the service the same."""
    from reconciler.config import loading, sources

    for module in (sources, loading):
        monkeypatch.setattr(module, "MAX_FILE_BYTES", 300_000)  # the shipped tree's largest file holds 235,512
    (shipped_tree / "catalog/connectors/ocr-tesseract/model.bin").write_bytes(b"\0" * 500_000)
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-qm", "a model in the tree")
    for source in (FolderSource(shipped_tree), GitSource(shipped_tree, "HEAD")):
        _, files = source.read()
        blob = files["catalog/connectors/ocr-tesseract/model.bin"]
        assert (blob.data, blob.oversize) == (b"", 500_000)  # never read
        snapshot = Loader().load(source)
        found = [(f.code, f.file, f.message) for f in snapshot.findings if f.code == "F009"]
        assert found == [("F009", "catalog/connectors/ocr-tesseract/model.bin", "this file holds 500,000 bytes, over "
                          "the 300,000 a file of the config tree may hold; it is not read")]
        assert not snapshot.ok
