"""`handler token create | list | revoke` on the shipped tree's own store: the token is printed once, on the last
line, and works until it is revoked; the store never holds its text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.governance.credentials import CredentialError, Credentials, Principal
from reconciler.governance.store import open_store, store_url


@pytest.fixture
def tree(shipped_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("HANDLER_STORE_URL", raising=False)
    monkeypatch.delenv("HANDLER_STATE_DIR", raising=False)
    return shipped_tree


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _authenticate(tree: Path, token: str, profile: str) -> Principal:
    store = open_store(store_url(tree))
    try:
        return asyncio.run(Credentials(store).authenticate(f"Bearer {token}", profile))
    finally:
        store.close()


def test_a_token_is_printed_once_on_its_last_line_listed_without_its_text_and_revoked(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "token", "create", "researcher", "--name", "ci", "--instance", "nightly",
                         "--expires", "30d", "--root", str(tree))
    assert (code, err) == (0, "")
    token = out.splitlines()[-1]
    assert token.startswith("hst_")
    assert "Token 'ci' of profile researcher, instance nightly, expires" in out
    assert _authenticate(tree, token, "researcher") == Principal("researcher", "ci", "nightly")
    assert token.encode() not in (tree / ".handler" / "handler.db").read_bytes()

    code, out, _ = run(capsys, "token", "list", "--root", str(tree), "--format", "json")
    listed = json.loads(out)
    assert [(t["name"], t["profile"], t["instance"], t["expired"]) for t in listed] == [
        ("ci", "researcher", "nightly", False)]
    assert token not in out

    code, out, _ = run(capsys, "token", "revoke", "ci", "--root", str(tree))
    assert code == 0
    assert "Revoked token 'ci' of profile researcher" in out
    with pytest.raises(CredentialError, match="revoked"):
        _authenticate(tree, token, "researcher")
    code, _, err = run(capsys, "token", "revoke", "ci", "--root", str(tree))
    assert code == 1
    assert "no token is named 'ci'" in err


def test_a_token_of_an_unknown_profile_or_a_bad_expiry_is_refused_and_nothing_is_made(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "token", "create", "nobody", "--root", str(tree))
    assert code == 1
    assert "no profile 'nobody'" in err
    assert "researcher" in err
    with pytest.raises(SystemExit):
        main(["token", "create", "researcher", "--expires", "soon", "--root", str(tree)])
    assert "does not read as a duration" in capsys.readouterr().err
    code, _, err = run(capsys, "token", "list", "--root", str(tree))
    assert code == 2
    assert "there is no store" in err


def test_a_default_token_is_named_after_its_profile_and_expires_in_90_days(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "token", "create", "auditor", "--root", str(tree))
    assert code == 0
    assert "Token 'auditor-" in out
    code, out, _ = run(capsys, "token", "list", "--root", str(tree))
    line = out.strip()
    assert line.startswith("auditor-")
    assert " auditor  made " in line
    assert "expires" in line
