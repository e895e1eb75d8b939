"""Signed decision links, owners' sign-in links and sessions, and Slack request signatures: what they accept
and why they refuse."""

from __future__ import annotations

import hashlib
import hmac
import stat
import time
from pathlib import Path

import orjson
import pytest

from reconciler.gitops.webhook import verify_signature
from reconciler.web.links import LinkSigner, SpentTokens, load_link_secret
from reconciler.web.slack import parse_interaction, verify_request

KEY = b"k" * 32


def test_a_link_decides_for_its_member_on_its_hold_until_it_expires() -> None:
    signer = LinkSigner(KEY)
    link = signer.sign("req_1", "bob", now=1_000_000.0)
    params = {"member": link.member, "expires": str(link.expires), "sig": link.sig}
    assert signer.check("req_1", params, now=1_000_000.0) == ("bob", "")
    assert signer.check("req_2", params, now=1_000_000.0)[0] is None  # another hold
    assert signer.check("req_1", {**params, "member": "alice"}, now=1_000_000.0)[0] is None
    assert signer.check("req_1", {**params, "expires": str(link.expires + 86400)}, now=1_000_000.0)[0] is None
    late, why = signer.check("req_1", params, now=link.expires + 1.0)
    assert late is None
    assert "expired" in why
    assert LinkSigner(b"x" * 32).check("req_1", params, now=1_000_000.0)[0] is None  # another key
    assert "opened without a decision link" in signer.check("req_1", {})[1]
    assert "not a number" in signer.check("req_1", {**params, "expires": "soon"})[1]


def test_the_link_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    first = load_link_secret(tmp_path / "state", {})
    assert load_link_secret(tmp_path / "state", {}) == first
    assert stat.S_IMODE((tmp_path / "state/link.key").stat().st_mode) == 0o600
    assert load_link_secret(tmp_path / "state", {"HANDLER_LINK_SECRET": "given-secret-of-length"}) == (
        b"given-secret-of-length")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        LinkSigner(b"short")


def _sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "v0=" + hmac.new(secret, f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()


def test_slack_requests_are_checked_for_signature_and_age() -> None:
    body = b"payload=%7B%7D"
    now = 1_700_000_000.0
    good = _sign(b"s", "1700000000", body)
    assert verify_request(b"s", "1700000000", body, good, now=now) is None
    assert verify_request(b"s", "1700000000", body + b"x", good, now=now) is not None  # a changed body
    assert "five minutes" in (verify_request(b"s", "1700000000", body, good, now=now + 301) or "")
    assert "five minutes" in (verify_request(b"s", "1700000000", body, good, now=now - 301) or "")
    assert "no X-Slack" in (verify_request(b"s", None, body, good, now=now) or "")
    assert "does not match" in (verify_request(b"t", "1700000000", body, good, now=now) or "")


def test_only_a_click_on_a_holds_button_is_an_action() -> None:
    def form(payload: object) -> bytes:
        from urllib.parse import urlencode

        return urlencode({"payload": orjson.dumps(payload).decode()}).encode()

    click = {"type": "block_actions", "user": {"id": "U1", "username": "ann"}, "response_url": "https://r",
             "actions": [{"action_id": "handler_reject", "value": "req_9"}]}
    action = parse_interaction(form(click))
    assert (action.user_id, action.user_name, action.decision, action.hold_id, action.response_url) == (
        "U1", "ann", "reject", "req_9", "https://r")
    for bad in (b"", b"payload=not-json", form({**click, "type": "view_submission"}),
                form({**click, "actions": [{"action_id": "handler_details", "value": "req_9"}]}),
                form({**click, "user": "U1"})):
        with pytest.raises(ValueError, match=r"payload|block_actions|button"):
            parse_interaction(bad)


def test_a_session_signs_in_its_member_until_it_expires() -> None:
    signer = LinkSigner(KEY)
    cookie = signer.session("team:lead", now=1_000_000.0)  # a member id may hold a colon
    assert signer.session_member(cookie, now=1_000_000.0) == "team:lead"
    assert signer.session_member(cookie, now=1_000_000.0 + 8 * 86400) is None  # a week later: expired
    _, expires, mac = cookie.rsplit(":", 2)
    assert signer.session_member(f"owner:{expires}:{mac}", now=1_000_000.0) is None  # another member
    assert signer.session_member("", now=1_000_000.0) is None
    assert signer.session_member("garbage", now=1_000_000.0) is None
    # A decision link's signature is not a session's, nor the other way round.
    link = signer.sign("req_1", "bob", now=1_000_000.0)
    assert signer.session_member(f"bob:{link.expires}:{link.sig}", now=1_000_000.0) is None
    assert signer.csrf(cookie) != signer.csrf(signer.session("bob", now=1_000_000.0))


def test_a_sign_in_link_signs_its_member_in_until_it_expires() -> None:
    signer = LinkSigner(KEY)
    link = signer.sign_in("alice", now=1_000_000.0)
    params = {"member": link.member, "expires": str(link.expires), "nonce": link.nonce, "sig": link.sig}
    assert link.expires == 1_000_000 + 15 * 60
    assert signer.check_sign_in(params, now=1_000_000.0) == ("alice", "")
    for changed in ({"member": "bob"}, {"nonce": "0" * 32}, {"expires": str(link.expires + 3600)}):
        member, why = signer.check_sign_in({**params, **changed}, now=1_000_000.0)
        assert member is None
        assert "signature does not match" in why
    assert "expired" in signer.check_sign_in(params, now=link.expires + 1.0)[1]
    assert "handler dashboard login" in signer.check_sign_in({})[1]
    assert signer.sign_in("alice").nonce != signer.sign_in("alice").nonce  # each link its own
    # A decision link is no sign-in link, nor the other way round.
    decision = signer.sign("req_1", "alice", now=1_000_000.0)
    assert signer.check_sign_in({**params, "expires": str(decision.expires), "nonce": "req_1", "sig": decision.sig},
                                now=1_000_000.0)[0] is None
    assert signer.check(link.nonce, {"member": "alice", "expires": str(link.expires), "sig": link.sig},
                        now=1_000_000.0)[0] is None


def test_an_owner_session_is_signed_apart_from_a_member_session() -> None:
    signer = LinkSigner(KEY)
    owner = signer.owner_session("alice", now=1_000_000.0)
    member = signer.session("alice", now=1_000_000.0)
    assert signer.owner_member(owner, now=1_000_000.0) == "alice"
    assert signer.owner_member(owner, now=1_000_000.0 + 13 * 3600) is None  # a working day, then expired
    assert signer.owner_member(member, now=1_000_000.0) is None  # a decision link's session edits nothing
    assert signer.session_member(owner, now=1_000_000.0) is None
    _, expires, mac = owner.rsplit(":", 2)
    assert signer.owner_member(f"bob:{expires}:{mac}", now=1_000_000.0) is None


def test_a_sign_in_link_is_spent_once_even_across_a_restart(tmp_path: Path) -> None:
    used = SpentTokens(tmp_path)
    assert not used.spent("n1")
    assert used.use("n1", 2_000, now=1_000.0)
    assert used.spent("n1")
    assert not used.use("n1", 2_000, now=1_000.0)
    assert stat.S_IMODE((tmp_path / "sign-ins.used").stat().st_mode) == 0o600
    again = SpentTokens(tmp_path)  # the service restarted
    assert not again.use("n1", 2_000, now=1_500.0)
    assert again.use("n2", 4_000, now=3_000.0)  # n1's link expired meanwhile: forgotten, as it can no longer sign in
    assert (tmp_path / "sign-ins.used").read_text() == "n2,4000\n"


def test_links_never_point_at_a_wildcard_address(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from reconciler.web.channels import open_channels

    def public_url(host: str, env: dict[str, str]) -> str:
        channels = open_channels(None, lambda: None, tmp_path, env)  # type: ignore[arg-type]  # no store needed
        channels.set_public_url(host, 8765)
        return channels.notifier.public_url

    assert public_url("127.0.0.1", {}) == "http://127.0.0.1:8765"
    assert public_url("::1", {}) == "http://[::1]:8765"
    wildcard = "0.0.0.0"  # noqa: S104 - what `handler up --http 0.0.0.0:8765` binds
    assert public_url(wildcard, {"HANDLER_PUBLIC_URL": "https://approvals.example.org/"}) == (
        "https://approvals.example.org")
    with caplog.at_level("WARNING"):
        assert wildcard not in public_url(wildcard, {})
    assert "set HANDLER_PUBLIC_URL" in caplog.text


def test_times_that_are_not_ascii_digits_are_damaged_links_and_requests() -> None:
    signer = LinkSigner(KEY)
    for expires in ("\u00b2", "\u0661\u0662", "9" * 5000, "-5", "1e9", ""):
        assert signer.check("req_1", {"member": "alice", "expires": expires, "sig": "x"})[0] is None
        assert signer.check_sign_in({"member": "alice", "expires": expires, "nonce": "n", "sig": "x"})[0] is None
        assert signer.session_member(f"alice:{expires}:abc") is None
        assert signer.owner_member(f"alice:{expires}:abc") is None
        assert verify_request(KEY, expires or "x", b"body", "v0=abc") == "X-Slack-Request-Timestamp is not a number"
    assert "link is damaged" in signer.check("req_1", {"member": "alice", "expires": "\u00b2", "sig": "x"})[1]
    now = str(int(time.time()))
    assert verify_request(KEY, now, b"body", "v0=\u00e9") == "the signature does not match HANDLER_SLACK_SIGNING_SECRET"
    assert not verify_signature(b"secret", b"{}", "sha256=\u00e9")
