"""Who is calling an MCP endpoint over HTTP: a bearer credential of the profile it asks for, or a refusal.

The HTTP transport calls `Credentials.authenticate(authorization, profile)` with the request's `Authorization`
header before anything else of the request is read; the files endpoints do the same. It returns a `Principal`
(the profile, the credential's name, the agent run its calls count under) or raises `CredentialError`, which
carries the whole answer: 401, `WWW-Authenticate: Bearer ...`, and a body saying what was wrong and how to get a
credential. Tokens, not addresses, decide who is who: a request from loopback without one is refused like any other.

Two kinds of credential. The service's own tokens (`tokens.py`, `handler token create`), recognised by their
digest in the store; a positive answer is kept `CACHE_SECONDS`, so a busy agent costs the store one read a second
and a revoked token is refused by a running service within that time. And, when org.toml has `[http.auth]`, JWTs of
that issuer (`jwks.py`) naming the profile in the configured claim; a JWT verified in the last `CACHE_SECONDS` is
not verified again (its expiry still is). A token of another profile is refused with 401,
not 403: the credential is not valid for this resource (RFC 6750 §3.1 `invalid_token`), the answer names no other
profile, and an OAuth-capable host then runs its flow again for this one. With an issuer configured, every 401 also
names the RFC 9728 metadata document (`resource_metadata`) that `resource_metadata` here builds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from reconciler.config.models import HttpAuth
from reconciler.governance.errors import CredentialError, StoreError
from reconciler.governance.jwks import LEEWAY_SECONDS, IssuerKeys, IssuerUnreachableError, JwtRefusedError
from reconciler.governance.store import Store
from reconciler.governance.tokens import TokenRecord, digest_of, find_token, looks_like_token

__all__ = ["CACHE_SECONDS", "CredentialError", "Credentials", "Principal", "metadata_path"]

CACHE_SECONDS: Final = 1.0
_MOST_CACHED: Final = 10_000


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: its profile, the credential's name (a token's name, a JWT's subject) and the agent run its
    calls are logged and capped under (None: the caller's own word, as on the unix sockets)."""

    profile: str
    name: str
    instance: str | None = None


def metadata_path(profile: str) -> str:
    """The path of a profile endpoint's protected-resource metadata (RFC 9728 §3.1: inserted before the path)."""
    return f"/.well-known/oauth-protected-resource/mcp/{profile}"


class Credentials:
    """Checks bearer credentials of the MCP endpoints against the store's tokens and the org's issuer.

    `settings` is called on each check for the live `[http.auth]` (None: tokens only), so a reload that changes it
    applies at once; `public_url` (HANDLER_PUBLIC_URL) is the base of the URLs the answers name, else the
    `base_url` each call passes (the request's own)."""

    def __init__(self, store: Store | None, settings: Callable[[], HttpAuth | None] = lambda: None, *,
                 public_url: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._settings = settings
        self.public_url = public_url.rstrip("/") if public_url else None
        self._clock = clock
        self._issuer: IssuerKeys | None = None
        self._seen: dict[str, tuple[float, TokenRecord]] = {}  # digest -> (checked at, record)
        self._verified: dict[str, tuple[float, dict[str, Any]]] = {}  # a JWT's digest -> (verified at, claims)

    @property
    def auth(self) -> HttpAuth | None:
        return self._settings()

    async def authenticate(self, authorization: str | None, profile: str, *, base_url: str | None = None) -> Principal:
        """The principal of a request to `profile`'s endpoint, or `CredentialError` (the module's docstring)."""
        auth = self.auth
        bearer = _bearer(authorization)
        if bearer is None:
            said = "no Authorization header" if not authorization else "an Authorization header that is not a bearer"
            raise self._refusal(profile, auth, base_url, f"The request carries {said}.", error=None)
        if looks_like_token(bearer):
            record = await self._token(bearer)
            problem = self._token_problem(record, profile)
            if problem is None and record is not None:
                return Principal(profile, record.name, record.instance)
        elif auth is not None:
            try:
                return self._principal(await self._claims(bearer, auth), profile, auth)
            except JwtRefusedError as exc:
                problem = str(exc)
            except IssuerUnreachableError as exc:
                raise CredentialError(f"The identity provider's keys cannot be fetched now, so the JWT cannot be "
                                      f"checked: {exc}. Retry in a moment, or use a token of the service "
                                      f"(handler token create {profile}).\n", status=503,
                                      www_authenticate='Bearer realm="handler"') from None
        else:
            problem = "the bearer is not one of this service's tokens (they start with 'hst_')"
        raise self._refusal(profile, auth, base_url, f"The credential is refused: {problem}.", error="invalid_token")

    def resource_metadata(self, profile: str, base_url: str | None = None) -> dict[str, Any] | None:
        """The RFC 9728 document of `profile`'s endpoint naming the org's issuer; None with tokens alone (a
        discovery flow that cannot succeed is worse than none)."""
        auth = self.auth
        if auth is None:
            return None
        return {"resource": f"{self._base(base_url)}/mcp/{profile}", "authorization_servers": [auth.issuer],
                "bearer_methods_supported": ["header"], "resource_name": f"Handler services: profile {profile}"}

    def forget(self) -> None:
        """Drop the credentials checked recently (after a revocation in this process)."""
        self._seen.clear()
        self._verified.clear()

    async def _token(self, token: str) -> TokenRecord | None:
        digest = digest_of(token)
        now = self._clock()
        seen = self._seen.get(digest)
        if seen is not None and now - seen[0] < CACHE_SECONDS:
            return seen[1]
        if self.store is None:
            return None
        try:
            record = await asyncio.to_thread(find_token, self.store, token)
        except StoreError as exc:
            raise CredentialError(f"The service's tokens cannot be read now: {exc}. Retry in a moment.\n", status=503,
                                  www_authenticate='Bearer realm="handler"') from None
        if record is None:
            self._seen.pop(digest, None)
            return None
        if len(self._seen) >= _MOST_CACHED:
            self._seen.clear()
        self._seen[digest] = (now, record)
        return record

    def _token_problem(self, record: TokenRecord | None, profile: str) -> str | None:
        if record is None:
            if self.store is None:
                return "this service keeps no tokens (it runs without a governance store)"
            return "no such token: it was revoked, or never made by this service"
        if record.expired(self._clock()):
            return f"the token {record.name!r} has expired"
        if record.profile != profile:
            return f"the token {record.name!r} is not a token of profile {profile!r}"
        return None

    async def _claims(self, token: str, auth: HttpAuth) -> dict[str, Any]:
        """The verified claims of a JWT; a token verified in the last `CACHE_SECONDS` is not verified again (a
        signature check costs tens of microseconds), though its expiry is."""
        digest = digest_of(token)
        now = self._clock()
        issuer = self._issuer_keys(auth)
        seen = self._verified.get(digest)
        if seen is not None and now - seen[0] < CACHE_SECONDS:
            if now >= seen[1]["exp"] + LEEWAY_SECONDS:  # `verify` required exp
                raise JwtRefusedError("the JWT has expired: get a fresh one from the issuer")
            return seen[1]
        claims = await issuer.verify(token)
        if len(self._verified) >= _MOST_CACHED:
            self._verified.clear()
        self._verified[digest] = (now, claims)
        return claims

    def _issuer_keys(self, auth: HttpAuth) -> IssuerKeys:
        if self._issuer is None or self._issuer.auth != auth:
            self._issuer = IssuerKeys(auth)
            self._verified.clear()
        return self._issuer

    def _principal(self, claims: dict[str, Any], profile: str, auth: HttpAuth) -> Principal:
        named = claims.get(auth.profileClaim)
        if named != profile and not (isinstance(named, list) and profile in named):
            raise JwtRefusedError(f"the JWT's claim {auth.profileClaim!r} does not name profile {profile!r}")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise JwtRefusedError("the JWT has no subject ('sub')")
        instance = claims.get(auth.instanceClaim) if auth.instanceClaim else None
        if instance is not None and not isinstance(instance, str):
            raise JwtRefusedError(f"the JWT's claim {auth.instanceClaim!r} is not a string")
        return Principal(profile, subject[:200], instance)

    def _refusal(self, profile: str, auth: HttpAuth | None, base_url: str | None, what: str,
                 error: str | None) -> CredentialError:
        how = (f"A credential of profile {profile!r} is a token its operator makes with `handler token create "
               f"{profile}`, sent as the header `Authorization: Bearer <token>`")
        if auth is not None:
            how += (f", or a JWT from {auth.issuer} for audience {auth.audience!r} whose claim "
                    f"{auth.profileClaim!r} names {profile!r} (OAuth clients find the issuer at "
                    f"{self._base(base_url)}{metadata_path(profile)})")
        challenge = ['realm="handler"']
        if error is not None:
            challenge.append(f'error="{error}"')
        if auth is not None:
            challenge.append(f'resource_metadata="{self._base(base_url)}{metadata_path(profile)}"')
        return CredentialError(f"{what} {how}.\n", status=401, www_authenticate="Bearer " + ", ".join(challenge))

    def _base(self, base_url: str | None) -> str:
        return self.public_url or (base_url or "").rstrip("/")


def _bearer(authorization: str | None) -> str | None:
    """The credential of an `Authorization: Bearer <credential>` header (the scheme in any case), else None."""
    if not authorization:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential and " " not in credential else None
