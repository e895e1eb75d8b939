"""The HTTP listener of `handler up`: it starts in the service's loop, serves /healthz and /status,
verifies pushes before it passes them on, and stops when told."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reconciler.gitops.webhook import sign_body
from reconciler.web.http import HttpListener, build_app

SECRET = b"It's a Secret to Everybody"


def test_listener_serves_status_and_verifies_pushes() -> None:
    pushes: list[int] = []

    async def on_push() -> None:
        pushes.append(1)

    async def scenario() -> None:
        app = build_app(lambda: {"ready": True}, webhook_secret=SECRET, on_push=on_push,
                        token="scrape-token")  # noqa: S106 - a test's own
        listener = HttpListener(app, "127.0.0.1", 0)
        await listener.start()
        assert listener.started
        base = f"http://127.0.0.1:{listener.port}"
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/healthz")).json() == {"ok": True}
            assert (await client.get("/status")).status_code == 401  # no member, no token: not for any local user
            bearer = {"Authorization": "Bearer scrape-token"}
            assert (await client.get("/status", headers=bearer)).json() == {"ready": True}
            body = b'{"ref": "refs/heads/main"}'
            bad = await client.post("/hooks/git", content=body, headers={"X-Hub-Signature-256": "sha256=00"})
            assert bad.status_code == 401
            unsigned = await client.post("/hooks/git", content=body)
            assert unsigned.status_code == 401
            assert pushes == []
            good = await client.post(
                "/hooks/git",
                content=body,
                headers={"X-Hub-Signature-256": sign_body(SECRET, body), "X-GitHub-Event": "push"},
            )
            assert good.status_code == 202
            assert pushes == [1]
        await listener.aclose()
        async with httpx.AsyncClient(base_url=base) as client:
            with pytest.raises(httpx.ConnectError):  # stopped: nothing listens on the port any more
                await client.get("/healthz")

    asyncio.run(scenario())


def test_a_listener_without_a_git_source_answers_pings_and_ignores_pushes() -> None:
    async def scenario() -> None:
        listener = HttpListener(build_app(dict, webhook_secret=SECRET, on_push=None), "127.0.0.1", 0)
        await listener.start()
        body = b"{}"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener.port}") as client:
            ping = await client.post("/hooks/git", content=body, headers={
                "X-Hub-Signature-256": sign_body(SECRET, body), "X-GitHub-Event": "ping"})
            assert ping.json() == {"ok": True, "pong": True}
            push = await client.post("/hooks/git", content=body, headers={
                "X-Hub-Signature-256": sign_body(SECRET, body), "X-GitHub-Event": "push"})
            assert (push.status_code, push.json()) == (202, {"ok": True, "ignored": "push"})
        await listener.aclose()

    asyncio.run(scenario())


def test_without_a_secret_the_webhook_is_off() -> None:
    async def scenario() -> None:
        listener = HttpListener(build_app(dict, webhook_secret=None, on_push=None), "127.0.0.1", 0)
        await listener.start()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener.port}") as client:
            off = await client.post("/hooks/git", content=b"{}")
            assert off.status_code == 403
            assert "HANDLER_WEBHOOK_SECRET" in off.json()["error"]
        await listener.aclose()

    asyncio.run(scenario())
