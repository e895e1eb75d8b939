"""Signed links: a URL that lets one member decide one hold, and nothing else; and an owner's sign-in.

An email to an approver carries `/approvals/<id>?member=<m>&expires=<t>&sig=<hmac>`. Opening it
shows the hold and asks for confirmation; only the form's POST, which carries the same signature,
decides — so a mail scanner that follows the link decides nothing. Opening a valid link also signs
its member in to the dashboard (`session`: a signed cookie, `LINK_DAYS` long), where they may
decide the other holds they are entitled to; those forms carry a `csrf` token bound to the session.
The signature is HMAC-SHA256 over the hold, the member and the expiry, with `HANDLER_LINK_SECRET`,
else a random key made once in the state folder (`link.key`, mode 0600) and kept there, so links
survive a restart.

Editing the config from the dashboard needs more than a decision link, which travels by email: an owner
signs in with a link `handler dashboard login --member NAME` prints on the service's machine (it reads
the same key). That link is good for `SIGN_IN_MINUTES` and once (`SpentTokens` keeps its nonce,
in memory and in the state folder's `sign-ins.used`, until it expires); it gives an owner session
(`owner_session`, a cookie signed apart from the member session, `OWNER_HOURS` long) whose forms carry
a `csrf` token bound to it like the decision forms. Signing out ends the sessions the browser held, on
the server too: their signatures are kept in `sessions.ended` until they expire, so a copy of the
cookie opens nothing after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from reconciler.places import ensure_private_dir, open_private_file

__all__ = ["ENDED_SESSIONS", "LINK_DAYS", "OWNER_HOURS", "SIGN_IN_MINUTES", "USED_SIGN_INS", "LinkSigner", "SignInLink",
           "SignedLink", "SpentTokens", "epoch_seconds", "load_link_secret", "session_token"]

LINK_DAYS = 7  # a link decides for a week; the hold itself never expires (the dashboard and CLI still work)
SIGN_IN_MINUTES = 15  # an owner's sign-in link, printed on the service's machine, is opened at once
OWNER_HOURS = 12  # an owner's session for editing the config: a working day
_KEY_FILE = "link.key"
USED_SIGN_INS = "sign-ins.used"  # the nonces of owners' sign-in links already used
ENDED_SESSIONS = "sessions.ended"  # the signatures of sessions signed out before they expired
_EPOCH = re.compile(r"[0-9]{1,12}")  # seconds since 1970, ASCII: `str.isdigit` also takes "²", which `int` refuses


def epoch_seconds(text: str) -> int | None:
    """A time a link, a cookie or a request carries (seconds since 1970, at most 12 ASCII digits), or None."""
    return int(text) if _EPOCH.fullmatch(text) else None


@dataclass(frozen=True, slots=True)
class SignedLink:
    hold_id: str
    member: str
    expires: int
    sig: str

    def query(self) -> str:
        return urlencode({"member": self.member, "expires": self.expires, "sig": self.sig})


@dataclass(frozen=True, slots=True)
class SignInLink:
    member: str
    expires: int
    nonce: str
    sig: str

    def query(self) -> str:
        return urlencode({"member": self.member, "expires": self.expires, "nonce": self.nonce, "sig": self.sig})


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
        return self._session("session", member, days * 86400, now)

    def session_member(self, value: str, now: float | None = None) -> str | None:
        """The member a session cookie signs in, or None (absent, forged or expired)."""
        return self._session_member("session", value, now)

    def owner_session(self, member: str, *, hours: float = OWNER_HOURS, now: float | None = None) -> str:
        """A cookie value that lets `member` edit the config until it expires (whether they are still an owner
        is asked of the live config at each use)."""
        return self._session("owner", member, hours * 3600, now)

    def owner_member(self, value: str, now: float | None = None) -> str | None:
        """The member an owner session signs in, or None (absent, forged, expired, or a member session)."""
        return self._session_member("owner", value, now)

    def sign_in(self, member: str, *, minutes: float = SIGN_IN_MINUTES, now: float | None = None) -> SignInLink:
        """A one-time link that signs `member` in as an owner (`UsedSignIns` makes it one-time)."""
        expires = int((time.time() if now is None else now) + minutes * 60)
        nonce = secrets.token_hex(16)
        return SignInLink(member, expires, nonce, self._mac("sign-in", nonce, member, expires))

    def sign_in_url(self, base: str, member: str) -> str:
        return f"{base.rstrip('/')}/login?{self.sign_in(member).query()}"

    def check_sign_in(self, params: Mapping[str, str], now: float | None = None) -> tuple[str | None, str]:
        """(the member a sign-in link is for, "") when its signature holds and it has not expired, else (None, why).
        Whether it was used already is `UsedSignIns`'s to say."""
        member, expires, nonce, sig = (params.get(k, "") for k in ("member", "expires", "nonce", "sig"))
        if not (member and expires and nonce and sig):
            return None, ("this page was opened without a sign-in link; run `handler dashboard login --member NAME` "
                          "on the service's machine and open the link it prints")
        until = epoch_seconds(expires)
        if until is None:
            return None, "the link is damaged (its expiry is not a number)"
        if not hmac.compare_digest(self._mac("sign-in", nonce, member, until).encode(), sig.encode()):
            return None, "the link's signature does not match: it was changed, or signed with another key"
        if until < (time.time() if now is None else now):
            return None, "the sign-in link has expired; run `handler dashboard login --member NAME` again"
        return member, ""

    def _session(self, kind: str, member: str, seconds: float, now: float | None) -> str:
        expires = int((time.time() if now is None else now) + seconds)
        return f"{member}:{expires}:{self._mac(kind, '', member, expires)}"

    def _session_member(self, kind: str, value: str, now: float | None) -> str | None:
        parsed = _parse_session(value)
        if parsed is None:
            return None
        member, expires, mac = parsed
        if not hmac.compare_digest(self._mac(kind, "", member, expires).encode(), mac.encode()):
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
        until = epoch_seconds(expires)
        if until is None:
            return None, "the link is damaged (its expiry is not a number)"
        if not hmac.compare_digest(self._mac("decision", hold_id, member, until).encode(), sig.encode()):
            return None, "the link's signature does not match: it was changed, or signed with another key"
        if until < (time.time() if now is None else now):
            return None, "the link has expired; ask for a new one (`handler approvals link`) or use the CLI"
        return member, ""


def session_token(value: str) -> tuple[str, int] | None:
    """(the signature, the expiry) of a session cookie's value as it reads, unchecked; None if it does not read."""
    parsed = _parse_session(value)
    return (parsed[2], parsed[1]) if parsed is not None else None


def _parse_session(value: str) -> tuple[str, int, str] | None:
    """A session cookie's value `member:expires:signature` taken apart, unchecked; None if it does not read so."""
    parts = value.rsplit(":", 2)
    expires = epoch_seconds(parts[1]) if len(parts) == 3 else None
    return (parts[0], expires, parts[2]) if expires is not None else None


class SpentTokens:
    """Tokens already spent, each kept until it expires: in memory, and in a file of the state folder (0600) so a
    restart does not make a spent one good again. The nonces of owners' sign-in links (`USED_SIGN_INS`: a link is
    used once) and the signatures of sessions signed out (`ENDED_SESSIONS`)."""

    def __init__(self, state_dir: Path | None, name: str = USED_SIGN_INS) -> None:
        self._name = name
        self._path = state_dir / name if state_dir is not None else None
        self._lock = threading.Lock()
        self._used: dict[str, int] = self._read()

    def spent(self, nonce: str) -> bool:
        """Whether `nonce` was spent already."""
        with self._lock:
            return nonce in self._used

    def use(self, nonce: str, expires: int, now: float | None = None) -> bool:
        """Record `nonce` as spent until `expires`; False when it was spent before."""
        moment = time.time() if now is None else now
        with self._lock:
            if nonce in self._used:
                return False
            self._used = {n: e for n, e in self._used.items() if e >= moment}
            self._used[nonce] = expires
            self._write()
        return True

    def _read(self) -> dict[str, int]:
        if self._path is None:
            return {}
        try:
            with os.fdopen(open_private_file(self._path, os.O_RDONLY), "r", encoding="ascii") as handle:
                lines = handle.read().split()
        except (FileNotFoundError, UnicodeDecodeError):
            return {}
        kept = ((n, epoch_seconds(e)) for n, _, e in (line.partition(",") for line in lines))
        return {n: e for n, e in kept if e is not None}

    def _write(self) -> None:
        if self._path is None:
            return
        scratch = self._path.with_name(f".{self._name}.tmp")
        with contextlib.suppress(FileNotFoundError):
            scratch.unlink()
        with os.fdopen(open_private_file(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as handle:
            handle.write("".join(f"{n},{e}\n" for n, e in self._used.items()))
        scratch.replace(self._path)


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
