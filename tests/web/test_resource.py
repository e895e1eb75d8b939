"""The protected-resource metadata of a profile's MCP endpoint (RFC 9728) on a real listener: served, naming the
org's issuer, only where the org names one."""

from __future__ import annotations

import asyncio

import httpx

from reconciler.config.models import HttpAuth
from reconciler.governance.credentials import Credentials
from reconciler.web.http import HttpListener, ListenerSettings, build_app


def _metadata(auth: HttpAuth | None, public_url: str | None = None) -> httpx.Response:
    async def scenario() -> httpx.Response:
        credentials = Credentials(None, lambda: auth, public_url=public_url)
        app = build_app(dict, webhook_secret=None, on_push=None, credentials=credentials)
        listener = HttpListener(app, "127.0.0.1", 0, ListenerSettings(public_url=public_url))
        await listener.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener.port}") as client:
                return await client.get("/.well-known/oauth-protected-resource/mcp/researcher")
        finally:
            await listener.aclose()

    return asyncio.run(scenario())


def test_with_an_issuer_the_metadata_names_it_as_the_authorization_server() -> None:
    auth = HttpAuth(issuer="https://id.example.org/realms/agents", audience="handler-mcp")
    answer = _metadata(auth)
    assert answer.status_code == 200
    document = answer.json()
    assert document["authorization_servers"] == ["https://id.example.org/realms/agents"]
    assert document["resource"].startswith("http://127.0.0.1:")
    assert document["resource"].endswith("/mcp/researcher")
    behind_a_proxy = _metadata(auth, public_url="https://mcp.example.org")
    assert behind_a_proxy.json()["resource"] == "https://mcp.example.org/mcp/researcher"


def test_with_tokens_alone_no_metadata_is_advertised() -> None:
    answer = _metadata(None)
    assert answer.status_code == 404
    assert "handler token create PROFILE" in answer.text
