"""Checking a JWT from the org's identity provider (`[http.auth]` in org.toml) against its published keys.

`IssuerKeys` fetches the issuer's JWKS (from `jwksUri`, else the `jwks_uri` of its OpenID discovery document), keeps
it ten minutes, and fetches it again early for a key id it does not hold, at most once every 30 seconds: a stream of
tokens with made-up key ids cannot make the service hammer the issuer. `verify` checks a token with PyJWT: an
asymmetric algorithm only (`none` and the HMAC ones are refused: a public key must never verify a MAC), the key's
own algorithm, the signature, `exp`, `iss` and `aud` (30 s of clock skew allowed). `credentials.Credentials` calls
it and turns what it raises into the HTTP answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import httpx
import jwt

from reconciler.config.models import HttpAuth
from reconciler.governance.errors import GovernanceError

__all__ = ["ALGORITHMS", "LEEWAY_SECONDS", "IssuerKeys", "IssuerUnreachableError", "JwtRefusedError"]

ALGORITHMS: Final = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                               "EdDSA"})
_KEEP_SECONDS: Final = 600.0
_REFETCH_SECONDS: Final = 30.0
_FETCH_TIMEOUT: Final = 5.0
LEEWAY_SECONDS: Final = 30
_DISCOVERY: Final = "/.well-known/openid-configuration"
_MOST_BYTES: Final = 1 << 20  # a JWKS or a discovery document is a few kilobytes


class JwtRefusedError(GovernanceError):
    """The JWT is not a credential of this issuer and audience; the message says why, for the caller."""


class IssuerUnreachableError(GovernanceError):
    """The issuer's keys cannot be fetched now, so no JWT can be checked."""


class IssuerKeys:
    """The signing keys of one issuer, fetched when needed; `verify` checks a token against them."""

    def __init__(self, auth: HttpAuth, *, clock: Any = time.monotonic) -> None:
        self.auth = auth
        self._clock = clock
        self._keys: dict[str | None, dict[str, Any]] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def verify(self, token: str) -> dict[str, Any]:
        """The claims of `token` once its signature, expiry, issuer and audience check out."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise JwtRefusedError(f"the bearer is neither one of this service's tokens nor a JWT ({exc})") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise JwtRefusedError(f"the JWT is signed with alg {str(alg)[:20]!r}, which is not accepted: only "
                                  f"{', '.join(sorted(ALGORITHMS))}")
        kid = header.get("kid")
        jwk = await self._key(kid if isinstance(kid, str) else None)
        try:
            key = jwt.PyJWK(jwk, algorithm=None if "alg" in jwk else alg)
            return jwt.decode(token, key, algorithms=[alg], audience=self.auth.audience, issuer=self.auth.issuer,
                              leeway=LEEWAY_SECONDS, options={"require": ["exp", "iss", "aud", "sub"]})
        except jwt.ExpiredSignatureError:
            raise JwtRefusedError("the JWT has expired: get a fresh one from the issuer") from None
        except jwt.InvalidAudienceError:
            raise JwtRefusedError(f"the JWT is not for audience {self.auth.audience!r}") from None
        except jwt.InvalidIssuerError:
            raise JwtRefusedError(f"the JWT was not issued by {self.auth.issuer}") from None
        except jwt.InvalidSignatureError:
            raise JwtRefusedError("the JWT's signature does not verify with the issuer's key") from None
        except jwt.PyJWTError as exc:
            raise JwtRefusedError(f"the JWT is refused: {exc}") from None

    async def _key(self, kid: str | None) -> dict[str, Any]:
        """The issuer's key `kid` (with no kid, its only key), fetching the set again when it is old or lacks it."""
        async with self._lock:
            age = None if self._fetched_at is None else self._clock() - self._fetched_at
            if age is None or age > _KEEP_SECONDS or (self._find(kid) is None and age > _REFETCH_SECONDS):
                await self._refresh()
            found = self._find(kid)
        if found is None:
            which = f"key id {kid[:80]!r}" if kid is not None else "no key id"
            raise JwtRefusedError(f"the JWT names {which}, and the issuer's key set has no such key")
        return found

    def _find(self, kid: str | None) -> dict[str, Any] | None:
        if kid is None:
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    async def _refresh(self) -> None:
        async with httpx.AsyncClient(timeout=_FETCH_TIMEOUT, follow_redirects=False) as client:
            uri = self.auth.jwksUri
            if uri is None:
                discovery = await _fetch_json(client, self.auth.issuer.rstrip("/") + _DISCOVERY)
                uri = discovery.get("jwks_uri")
                if not isinstance(uri, str):
                    raise IssuerUnreachableError(f"the discovery document of {self.auth.issuer} names no jwks_uri: "
                                                 "set jwksUri in [http.auth]")
            keys = (await _fetch_json(client, uri)).get("keys")
        if not isinstance(keys, list):
            raise IssuerUnreachableError(f"{uri} is not a JSON Web Key Set (no 'keys' list)")
        self._keys = {k.get("kid"): k for k in keys if isinstance(k, dict) and k.get("use", "sig") == "sig"}
        self._fetched_at = self._clock()


async def _fetch_json(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    try:
        response = await client.get(url, headers={"Accept": "application/json"})
        response.raise_for_status()
        if len(response.content) > _MOST_BYTES:
            raise IssuerUnreachableError(f"{url} answered {len(response.content)} bytes, past the {_MOST_BYTES} taken")
        document = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise IssuerUnreachableError(f"cannot fetch {url}: {exc}") from None
    if not isinstance(document, dict):
        raise IssuerUnreachableError(f"{url} did not answer a JSON object")
    return document
