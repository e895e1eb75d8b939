"""The registry of finding codes and its documentation agree; findings render as STYLE asks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import reconciler.config
from reconciler.cli import main
from reconciler.config.findings import CODES, Finding, did_you_mean, suggest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "checks.md"


def test_every_code_is_documented_with_its_severity() -> None:
    rows = re.findall(r"^\| ([A-Z]\d{3}) \| (error|warning) \|", DOCS.read_text(), re.MULTILINE)
    assert dict(rows) == {c.id: c.severity.value for c in CODES.values()}


def test_github_annotation_escapes_newlines_and_names_the_place() -> None:
    finding = Finding(
        "B003", "config/bindings/a,b.toml", 4, "secret slot 'k' holds a literal value", "a ref", 'k = { env = "K" }'
    )
    line = finding.render_github()
    assert line.startswith("::error file=config/bindings/a%2Cb.toml,line=4,title=B003::")
    assert "\n" not in line
    assert '%0Aexpected: a ref%0Afix: k = { env = "K" }' in line


def test_an_unknown_name_gets_the_closest_known_one_and_the_choices() -> None:
    hint = suggest("ocr_extrct", ["ocr_extract", "ocr_pages"], none="(no tools)")
    assert hint.did_you_mean == " (did you mean 'ocr_extract'?)"
    assert hint.one_of == "one of: ocr_extract, ocr_pages"


def test_a_name_far_from_every_known_one_gets_only_the_choices() -> None:
    assert suggest("web-search", ["ocr", "send-email"]) == ("", "one of: ocr, send-email")
    assert suggest("x", [], none="(no tools)").one_of == "one of: (no tools)"
    assert suggest("#random", ["#approvals"], among="one of org.toml [slack] channels").one_of == (
        "one of org.toml [slack] channels: #approvals"
    )


def test_did_you_mean_is_part_of_the_config_rooms_public_face() -> None:
    assert reconciler.config.did_you_mean is did_you_mean
    assert "did_you_mean" in reconciler.config.__all__
    assert did_you_mean("ocr-locl", ["ocr-local", "mail-smtp"]) == " (did you mean 'ocr-local'?)"


def test_text_escapes_control_characters_so_no_file_name_forges_a_line(
        shipped_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (shipped_tree / "config/evil\n::error file=x::injected\r\x1b[2K").write_text("x")
    assert main(["validate", str(shipped_tree)]) == 0  # a stray file is a warning
    out = capsys.readouterr().out
    assert "config/evil\\n::error file=x::injected\\r\\x1b[2K:1: F005 warning:" in out
    assert not any(line.startswith("::") for line in out.splitlines())
    assert "\r" not in out
    assert "\x1b" not in out
