"""The registry of finding codes and its documentation agree; findings render as STYLE asks."""

from __future__ import annotations

import re
from pathlib import Path

from reconciler.config.findings import CODES, Finding

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
