"""The push webhook refuses unsigned and wrongly signed requests and triggers a fetch on a good one."""

from __future__ import annotations

import asyncio

import httpx

from reconciler.gitops.webhook import sign_body, verify_signature
from reconciler.web.http import HttpListener, build_app

SECRET = b"It's a Secret to Everybody"


def test_signature_matches_githubs_documented_example() -> None:
    # The example of GitHub's "Validating webhook deliveries" page.
    assert sign_body(SECRET, b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )
    assert verify_signature(SECRET, b"Hello, World!", sign_body(SECRET, b"Hello, World!"))
    assert not verify_signature(SECRET, b"Hello, World?", sign_body(SECRET, b"Hello, World!"))
    assert not verify_signature(SECRET, b"x", None)
    assert not verify_signature(b"", b"x", sign_body(b"", b"x"))


def test_listener_serves_status_and_verifies_pushes() -> None:
    pushes: list[int] = []

    async def on_push() -> None:
        pushes.append(1)

    async def scenario() -> None:
        app = build_app(lambda: {"ready": True}, webhook_secret=SECRET, on_push=on_push)
        listener = HttpListener(app, "127.0.0.1", 0)
        task = asyncio.create_task(listener.serve())
        async with asyncio.timeout(10):
            while not listener.started:
                await asyncio.sleep(0.01)
        base = f"http://127.0.0.1:{listener.port}"
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/healthz")).json() == {"ok": True}
            assert (await client.get("/status")).json() == {"ready": True}
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
        listener.stop()
        await task

    asyncio.run(scenario())
