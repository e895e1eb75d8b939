"""`handler validate` as a person and CI use it: exit codes, and the text, json and github formats."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.config import CODES

REPO = Path(__file__).resolve().parents[2]
BASE = Path(__file__).resolve().parent / "cases" / "_base"  # the valid tree the case folders change


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.fixture
def unowned(tmp_path: Path) -> Path:
    """The base tree with no owner: one warning (O005), no error."""
    root = tmp_path / "tree"
    shutil.copytree(BASE, root)
    _edit(root, "config/org.toml", "owner = true", "owner = false")
    return root


@pytest.fixture
def broken(unowned: Path) -> Path:
    """... and a literal secret: one error (B003)."""
    _edit(unowned, "config/bindings/mail-smtp.toml", '{ env = "SMTP_PASSWORD" }', '"hunter2"')
    return unowned


def test_the_shipped_tree_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: "), out


def test_a_broken_tree_exits_1(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(broken)]) == 1
    assert "B003" in capsys.readouterr().out


def test_an_interface_version_without_a_skill_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "tree"
    shutil.copytree(BASE, root)
    shutil.rmtree(root / "catalog/interfaces/ocr/v1/skills")
    assert main(["validate", str(root)]) == 1
    assert ("catalog/interfaces/ocr/v1/interface.toml:1: I016 interface version ocr/v1 has no skill"
            in capsys.readouterr().out)


def test_warnings_alone_exit_0(unowned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(unowned)]) == 0
    assert "O005 warning: " in capsys.readouterr().out


def test_a_missing_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("handler: ")
    assert "nowhere" in err


def test_an_unknown_base_ref_exits_2(
    tmp_path: Path, git: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "repo"
    shutil.copytree(BASE, root)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "base")
    assert main(["validate", str(root), "--base", "HEAD"]) == 0
    capsys.readouterr()
    assert main(["validate", str(root), "--base", "no-such-ref"]) == 2
    assert "'no-such-ref' is not a commit" in capsys.readouterr().err


def test_a_base_outside_git_exits_2(unowned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(unowned), "--base", "main"]) == 2
    assert "not inside a git repository" in capsys.readouterr().err


def test_json_lists_every_finding_with_its_place(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(broken), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["errors"], report["warnings"]) == (1, 1)
    assert {(f["code"], f["file"], f["line"], f["severity"]) for f in report["findings"]} == {
        ("B003", "config/bindings/mail-smtp.toml", 5, "error"),
        ("O005", "config/org.toml", 9, "warning"),
    }
    for finding in report["findings"]:
        assert finding["message"]
        assert finding["expected"]
        assert finding["fix"]


def test_github_prints_one_annotation_per_finding(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(broken), "--format", "github"]) == 1
    lines = capsys.readouterr().out.splitlines()
    error = next(line for line in lines if "title=B003" in line)
    assert error.startswith("::error file=config/bindings/mail-smtp.toml,line=5,title=B003::secret slot 'password'")
    assert "%0Aexpected: a reference" in error
    assert '%0Afix: password = { env = "' in error
    warning = next(line for line in lines if "title=O005" in line)
    # The fix spans two lines in the finding; the annotation keeps it on one, escaped.
    assert warning.startswith("::warning file=config/org.toml,line=9,title=O005::")
    assert "%0Afix: [members.<id>]%0Aowner = true" in warning
    assert all(line.startswith("::") or line.startswith("handler validate: ") for line in lines)


def test_text_reads_file_line_code_then_expected_and_fix(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(broken)]) == 1
    out = capsys.readouterr().out
    assert (
        "config/bindings/mail-smtp.toml:5: B003 secret slot 'password' holds a literal value\n"
        '  expected: a reference — { command = [...] }, { env = "NAME" } or { file = "path" }\n'
        "  fix: password = { env = "
    ) in out
    assert (
        "config/org.toml:9: O005 warning: no member has owner = true, so holds that no routing or policy sends "
        "anywhere have no approver\n"
        "  expected: at least one owner\n"
        "  fix: [members.<id>]\n"
        "       owner = true\n"
    ) in out
    heads = [line for line in out.splitlines() if re.match(r"^\S+:\d+: [A-Z]\d{3} ", line)]
    assert len(heads) == 2
    summary = "1 error(s), 1 warning(s) in 2 interface versions, 2 connectors, 2 bindings, 2 profiles."
    assert out.rstrip().endswith(summary)


def test_codes_lists_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--codes"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(CODES)


def test_an_llm_binding_whose_base_url_its_egress_does_not_reach_is_refused(
        shipped_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The built-in llm runs in the router: a base_url outside its binding's egress would be refused at every call,
    so validate says so first (B011), naming the binding."""
    _edit(shipped_tree, "config/bindings/llm-openai.toml", 'model = "gpt-4o-mini" }',
          'model = "gpt-4o-mini", base_url = "http://127.0.0.1:18999" }')
    assert main(["validate", str(shipped_tree)]) == 1
    out = capsys.readouterr().out
    assert ("config/bindings/llm-openai.toml:6: B011 base_url 'http://127.0.0.1:18999' cannot be reached: "
            "127.0.0.1:18999 is not in its egress (api.openai.com:443)") in out, out
