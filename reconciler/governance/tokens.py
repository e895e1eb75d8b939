"""The service's own bearer tokens for the MCP endpoints over HTTP: made, listed and revoked by `handler token`.

A token is `hst_` and 43 characters of base64url (256 random bits). It names one profile and, when given, the agent
run (instance) its calls are logged and capped under. It is shown once, when made; the store keeps its SHA-256
(`store/tokens.py`), which is enough to recognise it and useless to send. A fast hash is the right one here: the
token is random, not a password, so there is nothing to guess. `credentials.Credentials` checks tokens on requests.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from reconciler.config.models import MAX_NAME_CHARS
from reconciler.governance.errors import StoreRefusedError, TokenError
from reconciler.governance.store import Store, now
from reconciler.governance.store.tokens import delete_token, fetch_token, fetch_tokens, insert_token
from reconciler.wire.meta import run_id_problem

__all__ = ["TOKEN_PREFIX", "IssuedToken", "TokenRecord", "create_token", "digest_of", "find_token", "list_tokens",
           "looks_like_token", "parse_duration", "revoke_token"]

TOKEN_PREFIX = "hst_"  # noqa: S105 - the prefix that tells the service's tokens from JWTs, not a secret
_TOKEN = re.compile(r"hst_[A-Za-z0-9_-]{43}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"([1-9][0-9]{0,5})([mhdw])")


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A stored token, without its text."""

    name: str
    profile: str
    instance: str | None
    created_at: float
    created_by: str
    expires_at: float | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TokenRecord:
        return cls(row["name"], row["profile"], row["instance"], row["created_at"], row["created_by"],
                   row["expires_at"])

    def expired(self, at: float) -> bool:
        return self.expires_at is not None and at >= self.expires_at


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A token just made: its record and its text, which nothing keeps."""

    record: TokenRecord
    token: str


def digest_of(token: str) -> str:
    """The hex SHA-256 the store keeps of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def looks_like_token(text: str) -> bool:
    """Whether `text` has the shape of one of the service's tokens (any other bearer may be a JWT)."""
    return _TOKEN.fullmatch(text) is not None


def parse_duration(text: str) -> float | None:
    """Seconds of an expiry as `--expires` takes it: 90m, 12h, 30d, 2w; `never` is None."""
    given = text.strip().lower()
    if given == "never":
        return None
    match = _DURATION.fullmatch(given)
    if match is None:
        raise TokenError(f"--expires {text!r} does not read as a duration: write a number and a unit, m(inutes), "
                         "h(ours), d(ays) or w(eeks), e.g. 30d or 12h, or 'never'")
    return int(match[1]) * _UNITS[match[2]]


def create_token(store: Store, profile: str, *, name: str | None, instance: str | None,
                 expires_in: float | None, actor: str) -> IssuedToken:
    """Make a token of `profile` (the caller checked the profile exists), store its digest and return its text."""
    if instance is not None and (problem := run_id_problem(instance)) is not None:
        raise TokenError(f"--instance {problem}")
    name = name if name is not None else f"{profile}-{secrets.token_hex(3)}"
    if len(name) > MAX_NAME_CHARS or _NAME.fullmatch(name) is None:
        raise TokenError(f"--name {name[:120]!r} is not a token's name: letters, digits, '.', '_' and '-', starting "
                         f"with a letter or digit, at most {MAX_NAME_CHARS} characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = None if expires_in is None else now() + expires_in
    actor = actor[:200]
    values = {"name": name, "digest": digest_of(token), "profile": profile, "instance": instance,
              "created_by": actor, "expires_at": expires_at}
    try:
        added = insert_token(store, values)
    except StoreRefusedError:  # another `token create` of that name won the race
        added = False
    if not added:
        raise TokenError(f"a token named {name!r} exists already: choose another --name, or revoke that one first "
                         f"(handler token revoke {name})")
    return IssuedToken(TokenRecord(name, profile, instance, now(), actor, expires_at), token)


def find_token(store: Store, token: str) -> TokenRecord | None:
    """The stored token whose text is `token`, or None (unknown, or revoked)."""
    row = fetch_token(store, digest_of(token))
    return None if row is None else TokenRecord.from_row(row)


def list_tokens(store: Store) -> list[TokenRecord]:
    return [TokenRecord.from_row(row) for row in fetch_tokens(store)]


def revoke_token(store: Store, name: str, actor: str) -> TokenRecord:
    """Delete the token named `name`: from then on it is refused (by a running service within
    `credentials.CACHE_SECONDS`)."""
    row = delete_token(store, name, actor[:200])
    if row is None:
        known = ", ".join(t.name for t in list_tokens(store)) or "none"
        raise TokenError(f"no token is named {name!r} (tokens: {known}); `handler token list` shows them")
    return TokenRecord.from_row(row)
