"""Session ids as signed records (`reconciler/router/resumption.py`): read back whole under the key that signed them,
refused when forged, cut or signed under another key; the key made once, private, and shared by every router."""

from __future__ import annotations

import stat
from pathlib import Path

from reconciler.router.resumption import KEY_NAME, SessionRecord, SessionSigner, load_key

RECORD = SessionRecord("researcher", "ci-token", "2025-11-25", "tree:abc123", "nightly", {"sampling": {}})


def test_an_id_carries_its_record_back_under_the_key_that_signed_it(tmp_path: Path) -> None:
    signer = SessionSigner(load_key(tmp_path))
    session_id = signer.issue(RECORD)
    read = signer.read(session_id)
    assert read is not None
    assert (read.profile, read.principal, read.version, read.revision, read.instance, read.capabilities) == (
        "researcher", "ci-token", "2025-11-25", "tree:abc123", "nightly", {"sampling": {}})
    assert read.nonce
    assert read.issued > 0
    assert signer.issue(RECORD) != session_id  # two sessions of one record are two ids
    assert all(0x21 <= ord(c) <= 0x7E for c in session_id)  # visible ASCII, as Mcp-Session-Id must be


def test_a_forged_cut_or_foreign_id_is_refused(tmp_path: Path) -> None:
    signer = SessionSigner(load_key(tmp_path))
    session_id = signer.issue(RECORD)
    payload, _, signature = session_id.partition(".")
    (tmp_path / "elsewhere").mkdir()
    assert SessionSigner(load_key(tmp_path / "elsewhere")).read(session_id) is None  # another state folder's key
    admin = SessionRecord("admin", "ci-token", "2025-11-25", "tree:abc123", "nightly")
    forged = signer.issue(admin).partition(".")[0]
    assert signer.read(f"{forged}.{signature}") is None  # another record under this one's signature
    assert signer.read(payload) is None
    assert signer.read(session_id[:-2]) is None
    assert signer.read("x" * 5000) is None


def test_the_key_is_made_once_private_and_every_router_reads_the_same(tmp_path: Path) -> None:
    first = load_key(tmp_path)
    assert stat.S_IMODE((tmp_path / KEY_NAME).stat().st_mode) == 0o600
    assert load_key(tmp_path) == first
    assert len(first) == 32
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY_NAME]  # no draft left behind
