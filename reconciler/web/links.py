"""Signed decision links: a URL that lets one member decide one hold, and nothing else.

An email to an approver carries `/approvals/<id>?member=<m>&expires=<t>&sig=<hmac>`. Opening it
shows the hold and asks for confirmation; only the form's POST, which carries the same signature,
decides — so a mail scanner that follows the link decides nothing. Opening a valid link also signs
its member in to the dashboard (`session`: a signed cookie, `LINK_DAYS` long), where they may
decide the other holds they are entitled to; those forms carry a `csrf` token bound to the session.
The signature is HMAC-SHA256 over the hold, the member and the expiry, with `HANDLER_LINK_SECRET`,
else a random key made once in the state folder (`link.key`, mode 0600) and kept there, so links
survive a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from reconciler.places import ensure_private_dir, open_private_file

__all__ = ["LINK_DAYS", "LinkSigner", "SignedLink", "load_link_secret"]

LINK_DAYS = 7  # a link decides for a week; the hold itself never expires (the dashboard and CLI still work)
_KEY_FILE = "link.key"


@dataclass(frozen=True, slots=True)
class SignedLink:
    hold_id: str
    member: str
    expires: int
    sig: str

    def query(self) -> str:
        return urlencode({"member": self.member, "expires": self.expires, "sig": self.sig})


class LinkSigner:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the link secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, kind: str, hold_id: str, member: str, expires: int) -> str:
        """HMAC over what is signed: a decision on one hold, or a sign-in (`kind` keeps them apart)."""
        message = f"handler-{kind}\n{hold_id}\n{member}\n{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def sign(self, hold_id: str, member: str, *, days: float = LINK_DAYS, now: float | None = None) -> SignedLink:
        expires = int((time.time() if now is None else now) + days * 86400)
        return SignedLink(hold_id, member, expires, self._mac("decision", hold_id, member, expires))

    def url(self, base: str, hold_id: str, member: str) -> str:
        return f"{base.rstrip('/')}/approvals/{hold_id}?{self.sign(hold_id, member).query()}"

    def session(self, member: str, *, days: float = LINK_DAYS, now: float | None = None) -> str:
        """A cookie value that signs `member` in to the dashboard until it expires."""
        expires = int((time.time() if now is None else now) + days * 86400)
        return f"{member}:{expires}:{self._mac('session', '', member, expires)}"

    def session_member(self, value: str, now: float | None = None) -> str | None:
        """The member a session cookie signs in, or None (absent, forged or expired)."""
        parts = value.rsplit(":", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        member, expires, mac = parts[0], int(parts[1]), parts[2]
        if not hmac.compare_digest(self._mac("session", "", member, expires).encode(), mac.encode()):
            return None
        return member if expires >= (time.time() if now is None else now) else None

    def csrf(self, session: str) -> str:
        """The token a dashboard form carries, bound to the session that shows it."""
        return hmac.new(self._secret, f"handler-csrf\n{session}".encode(), hashlib.sha256).hexdigest()

    def check(self, hold_id: str, params: Mapping[str, str], now: float | None = None) -> tuple[str | None, str]:
        """(the member the link decides as, "") for a valid link, else (None, why not)."""
        member, expires, sig = params.get("member", ""), params.get("expires", ""), params.get("sig", "")
        if not (member and expires and sig):
            return None, "this page was opened without a decision link"
        if not expires.isdigit():
            return None, "the link is damaged (its expiry is not a number)"
        if not hmac.compare_digest(self._mac("decision", hold_id, member, int(expires)).encode(), sig.encode()):
            return None, "the link's signature does not match: it was changed, or signed with another key"
        if int(expires) < (time.time() if now is None else now):
            return None, "the link has expired; ask for a new one (`handler approvals link`) or use the CLI"
        return member, ""


def load_link_secret(state_dir: Path, env: Mapping[str, str] | None = None) -> bytes:
    """`HANDLER_LINK_SECRET`, else the key kept in the state folder (made on first use)."""
    env = os.environ if env is None else env
    given = env.get("HANDLER_LINK_SECRET", "")
    if given:
        return given.encode()
    path = state_dir / _KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read_key(path)
    ensure_private_dir(state_dir, "HANDLER_STATE_DIR")
    key = secrets.token_hex(32).encode()
    try:
        fd = open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:  # another process made it first: use theirs
        return _read_key(path)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return key


def _read_key(path: Path) -> bytes:
    """The kept key; one an older release left readable to others is made 0600 first (docs/architecture.md §7)."""
    with os.fdopen(open_private_file(path, os.O_RDONLY), "rb") as handle:
        return handle.read()
