"""The dashboard's catalog page: each connector's listed tier and evidence and its last check, a failed one red; each
interface's bindings and the profiles they serve, linked profile → binding → connector → interface."""

from __future__ import annotations

import json
from pathlib import Path

from reconciler.config import FolderSource, Loader
from reconciler.web.catalog import binding_view, catalog_view, connector_view, profile_view, read_listing
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


def test_each_interface_lists_its_bindings_and_the_profiles_each_serves_with_links_down_the_chain(
        shipped_tree: Path) -> None:
    snapshot = Loader().load(FolderSource(shipped_tree))
    interfaces = catalog_view(snapshot, None)
    ocr = next(i for i in interfaces if i["key"] == "ocr/v1")
    assert {b["name"]: b["used_by"] for b in ocr["bindings"]} == {
        "ocr-local": ["auditor", "researcher"], "ocr-mistral-perso": []}
    html = _templates().get_template("catalog.html").render(interfaces=interfaces, listed=False, who=None)
    row = html.split('id="ocr/v1-binding-ocr-local"')[1].split("</tr>")[0]
    assert '<a href="/bindings/ocr-local">ocr-local</a>' in row
    assert '<a href="/connectors/ocr-tesseract">ocr-tesseract</a>' in row
    assert '<a href="/profiles/auditor">auditor</a>, <a href="/profiles/researcher">researcher</a>' in row

    profile = profile_view(snapshot, "auditor")
    assert profile is not None
    ocr_service = next(s for s in profile["services"] if s["interface"] == "ocr")
    assert (ocr_service["key"], ocr_service["binding"], ocr_service["pinned"]) == ("ocr/v1", "ocr-local", True)
    assert [c["name"] for c in ocr_service["choices"]] == ["ocr-local", "ocr-mistral-perso"]
    page = _templates().get_template("profile.html").render(view=profile, owner="alice", mode="worktree", csrf="c")
    assert '<a href="/bindings/ocr-local">ocr-local</a>' in page
    assert '<option value="ocr-mistral-perso">ocr-mistral-perso (ocr-mistral: ocr/v1)</option>' in page

    binding = binding_view(snapshot, "ocr-local")
    assert binding is not None
    assert (binding["connector"], binding["used_by"]) == ("ocr-tesseract", [("auditor", "ocr/v1"),
                                                                            ("researcher", "ocr/v1")])
    page = _templates().get_template("binding.html").render(view=binding)
    assert '<a href="/connectors/ocr-tesseract">ocr-tesseract</a>' in page

    connector = connector_view(snapshot, "web-search-brave")
    assert connector is not None
    assert [s["name"] for s in connector["slots"]] == ["api_key"]
    page = _templates().get_template("connector.html").render(view=connector, owner="alice", mode="git", csrf="c",
                                                              secret_kinds=("env", "file"))
    assert '<a href="/catalog#web-search/v1"><code>web-search/v1</code></a>' in page
    assert '<select name="secret.api_key.kind"' in page
    assert '<option value="command">' not in page
    assert 'name="setting.country"' in page
    assert "Commit to a new branch and push it" in page


def test_the_overview_shows_each_finding_with_its_fix_a_failed_connector_red_and_reloads_itself() -> None:
    status = {
        "ready": False, "reason": "revision abc was invalid", "source": "worktree /t", "profiles": {
            "researcher": {"ocr": "ocr-local (ocr/v1)"}},
        "lastAttempt": {"revision": "abc", "result": "invalid", "reason": "watch", "time": "t", "findings": [
            {"code": "P001", "severity": "error", "file": "config/profiles/researcher.toml", "line": 8,
             "message": "binding 'ocr-locl' does not exist", "expected": "a binding", "fix": 'ocr = "ocr-local"'}]},
        "connectors": {"ocr-local": {"state": "failed", "message": "tesseract is missing", "drift": []},
                       "search-brave": {"state": "running", "message": "", "drift": []}},
    }
    html = _templates().get_template("overview.html").render(status=status, pending=0, troubled=[], violations=0,
                                                             refresh_every=10)
    assert '<meta http-equiv="refresh" content="10">' in html
    finding = html.split('class="finding"')[1].split("</tr>")[0]
    assert "binding &#39;ocr-locl&#39; does not exist" in finding
    assert '<code class="fix">fix: ocr = &#34;ocr-local&#34;</code>' in finding
    row = html.split('id="binding-ocr-local"')[1].split("</tr>")[0]
    assert '<span class="state failed">failed</span>' in row
    assert '<span class="state running">running</span>' in html.split('id="binding-search-brave"')[1]
    assert '<a href="/profiles/researcher"><strong>researcher</strong></a>' in html
    assert '<a href="/bindings/ocr-local">ocr-local</a>' in html
    assert "refresh" not in _templates().get_template("connector.html").render(
        view={"name": "x", "implements": [], "slots": [], "settings": [], "egress": [], "bindings": []},
        owner="alice", mode="worktree", csrf="c", secret_kinds=("env", "file"))
