"""The dashboard's catalog page: each connector's listed tier and evidence and its last check, a failed one red."""

from __future__ import annotations

import json
from pathlib import Path

from reconciler.config import FolderSource, Loader
from reconciler.web.catalog import catalog_view, read_listing
from reconciler.web.dashboard import _templates

LISTING = {
    "interfaces": {"embed/v1": [{"connector": "embed-local", "tier": "repeated", "evidence": "local"}],
                   "ocr/v1": []},
    "connectors": {
        "embed-local": {"checked": "2026-12-01T05:00:00Z", "passed": True, "evidence": "local", "current": True},
        "embed-openai": {"checked": "2026-12-01T06:00:00Z", "passed": True, "evidence": "stand-in", "current": True},
        "ocr-tesseract": {"checked": "2026-12-01T07:00:00Z", "passed": False, "evidence": "local", "current": True},
    },
}


def test_the_page_shows_tier_evidence_and_last_check_with_a_failed_one_red(shipped_tree: Path) -> None:
    (shipped_tree / "catalog/listing.json").write_text(json.dumps(LISTING))
    listing = read_listing(shipped_tree)
    assert listing == LISTING
    interfaces = catalog_view(Loader().load(FolderSource(shipped_tree)), listing)
    html = _templates().get_template("catalog.html").render(interfaces=interfaces, listed=True, who=None)
    embed = next(i for i in interfaces if i["key"] == "embed/v1")
    local = next(c for c in embed["connectors"] if c["name"] == "embed-local")
    vendor = next(c for c in embed["connectors"] if c["name"] == "embed-openai")
    assert (local["tier"], local["evidence"], local["passed"]) == ("repeated", "local", True)
    assert (vendor["tier"], vendor["evidence"], vendor["last_evidence"]) == (None, None, "stand-in")
    row = html.split('id="ocr/v1-ocr-tesseract"')[1].split("</tr>")[0]
    assert '<span class="state failed">failed</span>' in row
    assert "2026-12-01T07:00:00Z (local)" in row
    row = html.split('id="embed/v1-embed-local"')[1].split("</tr>")[0]
    assert '<span class="state ready">repeated</span>' in row
    assert "<td>local</td>" in row


def test_without_a_listing_the_page_says_nothing_is_shown_as_checked(shipped_tree: Path) -> None:
    assert read_listing(shipped_tree) is None
    interfaces = catalog_view(Loader().load(FolderSource(shipped_tree)), None)
    html = _templates().get_template("catalog.html").render(interfaces=interfaces, listed=False, who=None)
    assert "no connector below is shown as checked" in html
    assert "never checked" in html
    assert "state failed" not in html
