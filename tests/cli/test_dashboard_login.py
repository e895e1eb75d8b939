"""`handler dashboard login`: a one-time sign-in link for an owner, signed with the service's key, refused to anyone
else and where no service keeps its key."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from reconciler.cli import main
from reconciler.web.links import LinkSigner, load_link_secret
from tests.fixtures.echo_tree import write_echo_tree


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("HANDLER_STATE_DIR", "HANDLER_LINK_SECRET", "HANDLER_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    tree = write_echo_tree(tmp_path / "t")
    (tree / "config/org.toml").write_text((tree / "config/org.toml").read_text()
                                          + '\n[members.bob]\nemail = "bob@example.org"\n')
    return tree


def test_an_owner_gets_a_link_the_service_accepts(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = load_link_secret(root / ".handler")  # as the service makes it at its start
    assert main(["dashboard", "login", "--member", "owner", "--root", str(root),
                 "--url", "https://handler.example.org/"]) == 0
    out, err = capsys.readouterr()
    link = urlsplit(out.strip())
    assert (link.scheme, link.netloc, link.path) == ("https", "handler.example.org", "/login")
    fields = {k: v[0] for k, v in parse_qs(link.query).items()}
    assert LinkSigner(key).check_sign_in(fields) == ("owner", "")
    assert "it works once and signs owner in for 12 hours" in err


def test_a_name_that_is_no_member_and_a_folder_without_a_service_are_refused(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "login", "--member", "mallory", "--root", str(root)]) == 1
    assert "mallory is not a member in" in capsys.readouterr().err
    assert main(["dashboard", "login", "--member", "owner", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "no service keeps its link key in" in err
    assert "--state-dir" in err
    assert not (root / ".handler/link.key").exists()  # no key is made where no service runs
