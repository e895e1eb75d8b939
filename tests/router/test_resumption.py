"""Session ids as signed records (`reconciler/router/resumption.py`): read back whole under the key that signed them,
refused when forged, cut or signed under another key; the key made once, private, and shared by every router."""

from __future__ import annotations

import stat
from pathlib import Path

from reconciler.router.resumption import ENDED_NAME, KEY_NAME, Revocations, SessionRecord, SessionSigner, load_key

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


def test_an_ended_id_is_revoked_for_every_reader_of_the_folder_until_its_revision_is_gone(tmp_path: Path) -> None:
    """Two routers sharing a state folder: what one revokes the other refuses at once; revoking under a newer
    revision drops the lines of the others (their ids are refused for their revision anyway), so the file stays
    small; it is private."""
    here, there = Revocations(tmp_path / ENDED_NAME), Revocations(tmp_path / ENDED_NAME)
    assert not there.revoked("id-1")  # no file yet
    here.revoke("id-1", "rev-a")
    assert there.revoked("id-1")
    assert not there.revoked("id-2")
    there.revoke("id-2", "rev-a")
    assert here.revoked("id-1")
    assert here.revoked("id-2")
    here.revoke("id-3", "rev-b")
    assert (here.revoked("id-1"), here.revoked("id-3"), there.revoked("id-3")) == (False, True, True)
    assert len((tmp_path / ENDED_NAME).read_text().splitlines()) == 1
    assert stat.S_IMODE((tmp_path / ENDED_NAME).stat().st_mode) == 0o600


def test_revoking_a_session_of_an_older_revision_keeps_the_live_revisions_lines(tmp_path: Path) -> None:
    """A router still holds a session pinned to the revision before the live one; ending it must not forget the ids
    already revoked under the live revision."""
    ended = Revocations(tmp_path / ENDED_NAME)
    ended.revoke("live-id", "rev-b")
    ended.revoke("old-id", "rev-a", live="rev-b")
    assert ended.revoked("live-id")
    assert ended.revoked("old-id")
    ended.revoke("next-id", "rev-c")  # the live revision moved on: the others' lines go
    assert not ended.revoked("live-id")
    assert ended.revoked("next-id")
