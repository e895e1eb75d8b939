"""Bearer credentials of the MCP endpoints: the service's tokens on each store, and JWTs checked against a JWKS
that a real HTTP server on loopback serves, as an identity provider would."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

from reconciler.config.models import HttpAuth
from reconciler.governance.credentials import CACHE_SECONDS, CredentialError, Credentials, Principal
from reconciler.governance.errors import TokenError
from reconciler.governance.jwks import LEEWAY_SECONDS
from reconciler.governance.store import Store
from reconciler.governance.store.audit import read_audit
from reconciler.governance.tokens import create_token, list_tokens, parse_duration, revoke_token


async def _refused(credentials: Credentials, authorization: str | None, profile: str) -> CredentialError:
    with pytest.raises(CredentialError) as caught:
        await credentials.authenticate(authorization, profile, base_url="http://127.0.0.1:8765")
    return caught.value


def test_a_token_is_shown_once_kept_as_a_hash_and_names_its_profile_and_instance(store: Store) -> None:
    async def scenario() -> None:
        issued = create_token(store, "researcher", name="ci", instance="nightly", expires_in=3600, actor="alice")
        assert issued.token.startswith("hst_")
        with store.read() as conn:  # only the digest is stored: the text is nowhere in the table
            rows = [dict(r._mapping) for r in conn.exec_driver_sql("SELECT * FROM tokens")]
        assert len(rows) == 1
        assert issued.token not in json.dumps(rows)
        principal = await Credentials(store).authenticate(f"Bearer {issued.token}", "researcher")
        assert principal == Principal("researcher", "ci", "nightly")
        assert [(t.name, t.profile, t.instance) for t in list_tokens(store)] == [("ci", "researcher", "nightly")]
        assert [r["event"] for r in read_audit(store)] == ["token_created"]

    asyncio.run(scenario())


def test_a_token_of_another_profile_is_refused_401_naming_no_other_profile(store: Store) -> None:
    async def scenario() -> None:
        issued = create_token(store, "researcher", name="r1", instance=None, expires_in=None, actor="alice")
        refused = await _refused(Credentials(store), f"Bearer {issued.token}", "auditor")
        assert refused.status == 401
        assert refused.www_authenticate == 'Bearer realm="handler", error="invalid_token"'
        assert "is not a token of profile 'auditor'" in str(refused)
        assert "researcher" not in str(refused)
        assert "handler token create auditor" in str(refused)

    asyncio.run(scenario())


def test_no_credential_is_refused_saying_how_to_get_one_and_advertising_no_metadata(store: Store) -> None:
    async def scenario() -> None:
        credentials = Credentials(store)
        for header in (None, "", "Basic dXNlcjpwYXNz", "Bearer "):
            refused = await _refused(credentials, header, "researcher")
            assert (refused.status, refused.www_authenticate) == (401, 'Bearer realm="handler"')
            assert "handler token create researcher" in str(refused)
            assert "Authorization: Bearer <token>" in str(refused)
        assert credentials.resource_metadata("researcher", "http://127.0.0.1:8765") is None
        unknown = await _refused(credentials, "Bearer hst_" + "A" * 43, "researcher")
        assert "revoked, or never made" in str(unknown)
        jwt_without_issuer = await _refused(credentials, "Bearer eyJ.eyJ.sig", "researcher")
        assert "not one of this service's tokens" in str(jwt_without_issuer)

    asyncio.run(scenario())


def test_a_revoked_token_is_refused_once_the_check_it_passed_is_older_than_the_cache(store: Store) -> None:
    async def scenario() -> None:
        clock = [1_000_000.0]
        credentials = Credentials(store, clock=lambda: clock[0])
        issued = create_token(store, "researcher", name="gone", instance=None, expires_in=None, actor="alice")
        assert (await credentials.authenticate(f"Bearer {issued.token}", "researcher")).name == "gone"
        assert revoke_token(store, "gone", "bob").name == "gone"
        clock[0] += CACHE_SECONDS
        refused = await _refused(credentials, f"Bearer {issued.token}", "researcher")
        assert "revoked" in str(refused)
        assert [r["event"] for r in read_audit(store)] == ["token_created", "token_revoked"]
        with pytest.raises(TokenError, match="no token is named 'gone'"):
            revoke_token(store, "gone", "bob")

    asyncio.run(scenario())


def test_an_expired_token_is_refused(store: Store) -> None:
    async def scenario() -> None:
        issued = create_token(store, "researcher", name="short", instance=None, expires_in=60, actor="alice")
        credentials = Credentials(store, clock=lambda: time.time() + 61)
        refused = await _refused(credentials, f"Bearer {issued.token}", "researcher")
        assert "the token 'short' has expired" in str(refused)

    asyncio.run(scenario())


def test_names_instances_and_expiries_are_checked_before_anything_is_stored(store: Store) -> None:
    create_token(store, "researcher", name="twice", instance=None, expires_in=None, actor="alice")
    with pytest.raises(TokenError, match="exists already"):
        create_token(store, "auditor", name="twice", instance=None, expires_in=None, actor="alice")
    with pytest.raises(TokenError, match="not a token's name"):
        create_token(store, "researcher", name="../x", instance=None, expires_in=None, actor="alice")
    with pytest.raises(TokenError, match="--instance holds a control character"):
        create_token(store, "researcher", name="ok", instance="a\nb", expires_in=None, actor="alice")
    assert [t.name for t in list_tokens(store)] == ["twice"]
    assert (parse_duration("30d"), parse_duration("12h"), parse_duration("never")) == (30 * 86400, 12 * 3600, None)
    with pytest.raises(TokenError, match="does not read as a duration"):
        parse_duration("30 days")


# --- JWTs of an identity provider ---------------------------------------------------------------------------------


@dataclass
class Issuer:
    url: str
    key: RSAPrivateKey
    served: list[str]

    def sign(self, claims: dict[str, Any], *, kid: str = "k1", key: Any = None, algorithm: str = "RS256") -> str:
        payload = {"iss": self.url, "aud": "handler-mcp", "sub": "agent@example.org", "exp": int(time.time()) + 300,
                   "handler_profile": "researcher", **claims}
        return jwt.encode(payload, key if key is not None else self.key, algorithm=algorithm, headers={"kid": kid})


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    """An identity provider on loopback: its discovery document and its JWKS (one RSA key, kid k1)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    served: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.append(self.path)
            base = f"http://127.0.0.1:{self.server.server_address[1]}"
            documents = {"/.well-known/openid-configuration": {"issuer": base, "jwks_uri": f"{base}/jwks"},
                         "/jwks": {"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}}
            body = json.dumps(documents.get(self.path, {})).encode()
            self.send_response(200 if self.path in documents else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Issuer(f"http://127.0.0.1:{server.server_address[1]}", key, served)
    server.shutdown()
    server.server_close()


def _auth(issuer: Issuer) -> HttpAuth:
    return HttpAuth(issuer=issuer.url, audience="handler-mcp", instanceClaim="run")


def _unsigned(issuer: Issuer) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"iss": issuer.url, "aud": "handler-mcp", "sub": "x", "exp": int(time.time()) + 300,
              "handler_profile": "researcher"}
    return f"{part({'alg': 'none', 'kid': 'k1', 'typ': 'JWT'})}.{part(claims)}."


def test_a_jwt_of_the_issuer_naming_the_profile_is_a_principal(issuer: Issuer, sqlite_store: Store) -> None:
    async def scenario() -> None:
        auth = _auth(issuer)
        credentials = Credentials(sqlite_store, lambda: auth)
        principal = await credentials.authenticate(f"Bearer {issuer.sign({'run': 'r-7'})}", "researcher")
        assert principal == Principal("researcher", "agent@example.org", "r-7")
        listed = await credentials.authenticate(f"bearer {issuer.sign({'handler_profile': ['a', 'researcher']})}",
                                                "researcher")
        assert (listed.name, listed.instance) == ("agent@example.org", None)
        assert "/.well-known/openid-configuration" in issuer.served  # the keys were found by discovery

    asyncio.run(scenario())


@pytest.mark.parametrize(("case", "said"), [
    ("expired", "has expired"),
    ("audience", "not for audience 'handler-mcp'"),
    ("issuer", "was not issued by"),
    ("signature", "signature does not verify"),
    ("kid", "key id 'k9'"),
    ("none", "alg 'none'"),
    ("hmac", "alg 'HS256'"),
    ("profile", "claim 'handler_profile' does not name profile 'researcher'"),
    ("garbage", "neither one of this service's tokens nor a JWT"),
])
def test_a_jwt_is_refused_401_with_the_resource_metadata(issuer: Issuer, sqlite_store: Store, case: str,
                                                               said: str) -> None:
    async def scenario() -> None:
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048) if case == "signature" else None
        token = {
            "expired": lambda: issuer.sign({"exp": int(time.time()) - 3600}),
            "audience": lambda: issuer.sign({"aud": "someone-else"}),
            "issuer": lambda: issuer.sign({"iss": "https://evil.example"}),
            "signature": lambda: issuer.sign({}, key=other),
            "kid": lambda: issuer.sign({}, kid="k9"),
            "none": lambda: _unsigned(issuer),
            "hmac": lambda: issuer.sign({}, key=b"k" * 32, algorithm="HS256"),
            "profile": lambda: issuer.sign({"handler_profile": "auditor"}),
            "garbage": lambda: "not.a.jwt",
        }[case]()
        auth = _auth(issuer)
        refused = await _refused(Credentials(sqlite_store, lambda: auth), f"Bearer {token}", "researcher")
        assert refused.status == 401
        assert said in str(refused)
        metadata = "http://127.0.0.1:8765/.well-known/oauth-protected-resource/mcp/researcher"
        assert refused.www_authenticate == (f'Bearer realm="handler", error="invalid_token", '
                                            f'resource_metadata="{metadata}"')
        assert f"a JWT from {issuer.url}" in str(refused)

    asyncio.run(scenario())


def test_a_jwt_checked_a_moment_ago_is_not_verified_again_but_its_expiry_still_counts(issuer: Issuer) -> None:
    async def scenario() -> None:
        auth = _auth(issuer)
        exp = int(time.time()) + 100
        token = issuer.sign({"exp": exp})
        clock = [exp + LEEWAY_SECONDS - 0.4]  # this service's clock, just inside the leeway after exp
        credentials = Credentials(None, lambda: auth, clock=lambda: clock[0])
        assert (await credentials.authenticate(f"Bearer {token}", "researcher")).name == "agent@example.org"
        auth = _auth(issuer).model_copy(update={"audience": "changed"})  # a reload: verified again, and refused
        assert "not for audience 'changed'" in str(await _refused(credentials, f"Bearer {token}", "researcher"))
        auth = _auth(issuer)
        assert (await credentials.authenticate(f"Bearer {token}", "researcher")).name == "agent@example.org"
        clock[0] += 0.5  # within the second it is kept, but past exp and the leeway
        assert "has expired" in str(await _refused(credentials, f"Bearer {token}", "researcher"))

    asyncio.run(scenario())


def test_with_an_issuer_the_metadata_names_it_and_a_bare_request_is_pointed_at_it(issuer: Issuer) -> None:
    async def scenario() -> None:
        auth = _auth(issuer)
        credentials = Credentials(None, lambda: auth, public_url="https://mcp.example.org/")
        assert credentials.resource_metadata("researcher") == {
            "resource": "https://mcp.example.org/mcp/researcher", "authorization_servers": [issuer.url],
            "bearer_methods_supported": ["header"], "resource_name": "Handler services: profile researcher"}
        refused = await _refused(credentials, None, "researcher")
        assert refused.www_authenticate == ('Bearer realm="handler", resource_metadata="https://mcp.example.org'
                                            '/.well-known/oauth-protected-resource/mcp/researcher"')
        token = await _refused(credentials, "Bearer hst_" + "A" * 43, "researcher")  # no store: no tokens
        assert "keeps no tokens" in str(token)

    asyncio.run(scenario())


def test_an_issuer_that_cannot_be_reached_is_503_not_a_verdict_on_the_token(issuer: Issuer) -> None:
    async def scenario() -> None:
        auth = HttpAuth(issuer="http://127.0.0.1:9", audience="a")  # the discard port: nothing listens
        with pytest.raises(CredentialError) as caught:
            await Credentials(None, lambda: auth).authenticate(f"Bearer {issuer.sign({})}", "researcher")
        assert caught.value.status == 503
        assert "cannot be fetched now" in str(caught.value)

    asyncio.run(scenario())
