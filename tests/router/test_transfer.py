"""`PUT` and `GET /files/<profile>/<path>` on `handler up`'s own listener, with real HTTP requests: a file goes into
the profile's work folder and comes back, and traversal, links out, oversize bodies, another profile's token, no
token and another site's page are refused, with nothing written."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.app import UpOptions
from reconciler.governance.store import open_store
from reconciler.governance.tokens import create_token
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import short_dir
from tests.fixtures.service import running


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "token-A")
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_PUBLIC_URL", "HANDLER_DASHBOARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as path:
        yield path


class Up:
    """The service's listener, the work folder of `tester`, and a token of each profile."""

    def __init__(self, url: str, work: Path, tokens: dict[str, str]) -> None:
        self.url, self.work, self.tokens = url, work, tokens

    def auth(self, profile: str = "tester") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[profile]}"}


async def _up(short: Path) -> AsyncIterator[Up]:
    root = write_echo_tree(short / "tree", profiles=("tester", "other"))
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0, sandbox=False)
    async with running(options) as service:
        assert service.listener is not None
        store = open_store(f"sqlite:///{short / 'state' / 'handler.db'}")
        try:
            tokens = {p: create_token(store, p, name=p, instance=None, expires_in=3600, actor="test").token
                      for p in ("tester", "other")}
        finally:
            store.close()
        yield Up(f"http://127.0.0.1:{service.listener.port}", root / "work/tester", tokens)


def _run(short: Path, body: object) -> None:
    async def scenario() -> None:
        async for up in _up(short):
            async with httpx.AsyncClient(base_url=up.url, timeout=10) as client:
                await body(up, client)  # type: ignore[operator]

    asyncio.run(asyncio.wait_for(scenario(), 60))


def _leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_file_put_lands_in_the_work_folder_atomically_and_comes_back(short: Path) -> None:
    async def body(up: Up, client: httpx.AsyncClient) -> None:
        put = await client.put("/files/tester/scans/page.png", content=b"\x89PNG" + b"x" * 900, headers=up.auth())
        assert put.status_code == 201
        assert put.json() == {"path": "scans/page.png", "bytes": 904}
        on_disk = up.work / "scans/page.png"
        assert on_disk.read_bytes() == b"\x89PNG" + b"x" * 900
        assert oct(on_disk.stat().st_mode & 0o777) == "0o644"
        replaced = await client.put("/files/tester/scans/page.png", content=b"new", headers=up.auth())
        assert replaced.status_code == 201
        got = await client.get("/files/tester/scans/page.png", headers=up.auth())
        assert (got.status_code, got.content, got.headers["content-type"]) == (200, b"new", "application/octet-stream")
        assert _leftovers(up.work) == ["scans", "scans/page.png"]  # no temporary file left
        missing = await client.get("/files/tester/scans/nothing.png", headers=up.auth())
        assert (missing.status_code, missing.text) == (404, "There is no file 'scans/nothing.png' in the work "
                                                             "folder.\n")

    _run(short, body)


def test_no_token_and_another_profiles_token_are_refused_401_and_nothing_is_written(short: Path) -> None:
    async def body(up: Up, client: httpx.AsyncClient) -> None:
        bare = await client.put("/files/tester/a.txt", content=b"hi")
        assert bare.status_code == 401
        assert bare.headers["www-authenticate"] == 'Bearer realm="handler"'
        assert "handler token create tester" in bare.text
        other = await client.put("/files/tester/a.txt", content=b"hi", headers=up.auth("other"))
        assert other.status_code == 401
        assert 'error="invalid_token"' in other.headers["www-authenticate"]
        read = await client.get("/files/tester/a.txt", headers=up.auth("other"))
        assert read.status_code == 401
        assert _leftovers(up.work) == []
        mine = await client.put("/files/other/a.txt", content=b"hi", headers=up.auth("other"))
        assert mine.status_code == 201

    _run(short, body)


def test_a_path_that_climbs_out_or_names_a_folder_is_refused(short: Path) -> None:
    async def body(up: Up, client: httpx.AsyncClient) -> None:
        for path in ("a/%2e%2e/%2e%2e/escape.txt", "%2e%2e/escape.txt", "a//b.txt", "%2e/a.txt", "folder/"):
            refused = await client.put(f"/files/tester/{path}", content=b"x", headers=up.auth())
            assert refused.status_code == 400, path
        assert not (up.work.parent / "escape.txt").exists()
        assert not (up.work.parent.parent / "escape.txt").exists()
        assert _leftovers(up.work) == []
        raw = await asyncio.to_thread(_raw_request, up.url, "PUT /files/tester/../other/a.txt", up.tokens["tester"])
        assert raw.startswith("HTTP/1.1 400")
        assert not (up.work.parent / "other/a.txt").exists()

    _run(short, body)


def test_a_symbolic_link_out_of_the_work_folder_is_never_followed(short: Path) -> None:
    async def body(up: Up, client: httpx.AsyncClient) -> None:
        outside = up.work.parent.parent / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text("keep")
        (up.work / "out").symlink_to(outside)
        (up.work / "leaf.txt").symlink_to(outside / "secret.txt")
        through = await client.put("/files/tester/out/new.txt", content=b"x", headers=up.auth())
        assert through.status_code == 403
        assert "a symbolic link, which is never followed" in through.text
        over = await client.put("/files/tester/leaf.txt", content=b"overwritten", headers=up.auth())
        assert over.status_code == 409
        assert (outside / "secret.txt").read_text() == "keep"
        assert _leftovers(outside) == ["secret.txt"]
        for path in ("out/secret.txt", "leaf.txt"):
            read = await client.get(f"/files/tester/{path}", headers=up.auth())
            assert read.status_code in (403, 409), path
            assert "keep" not in read.text

    _run(short, body)


def test_a_body_past_the_largest_max_file_bytes_is_refused_declared_or_streamed(short: Path) -> None:
    async def body(up: Up, client: httpx.AsyncClient) -> None:
        declared = await client.put("/files/tester/big.bin", content=b"x" * 1001, headers=up.auth())
        assert declared.status_code == 413
        assert "takes at most 1000" in declared.text

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked, cut as it passes the limit
            for _ in range(20):
                yield b"y" * 100

        streamed = await client.put("/files/tester/big.bin", content=chunks(), headers=up.auth())
        assert streamed.status_code == 413
        assert _leftovers(up.work) == []
        exact = await client.put("/files/tester/big.bin", content=b"z" * 1000, headers=up.auth())
        assert exact.status_code == 201

    _run(short, body)


def test_a_page_of_another_origin_or_a_rebinding_host_is_refused_even_with_the_token(short: Path) -> None:
    async def body(up: Up, client: httpx.AsyncClient) -> None:
        page = await client.put("/files/tester/a.txt", content=b"x",
                                headers={**up.auth(), "Origin": "http://evil.example"})
        assert page.status_code == 403
        assert "not this service's" in page.text
        for origin in ("null", "http://127.0.0.1:1", "file://", "https://127.0.0.1"):  # none is this service's
            other = await client.put("/files/tester/a.txt", content=b"x", headers={**up.auth(), "Origin": origin})
            assert other.status_code == 403, origin
        rebound = await client.get("/files/tester/a.txt", headers={**up.auth(), "Host": "evil.example"})
        assert rebound.status_code == 400
        same = await client.put("/files/tester/a.txt", content=b"x", headers={**up.auth(), "Origin": up.url})
        assert same.status_code == 201
        assert _leftovers(up.work) == ["a.txt"]

    _run(short, body)


def _raw_request(url: str, line: str, token: str) -> str:
    """One request written as it is, path untouched by any client library; the status line and what follows."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"{line} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Length: 1\r\nConnection: close\r\n\r\nx".encode())
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received.decode("latin-1")


def test_delete_removes_a_file_or_an_empty_folder_never_through_a_link(short: Path) -> None:
    async def body(up: Up, client: httpx.AsyncClient) -> None:
        outside = up.work.parent.parent / "outside"
        outside.mkdir()
        (outside / "keep.txt").write_text("keep")
        (up.work / "out").symlink_to(outside)
        assert (await client.put("/files/tester/dir/a.txt", content=b"x", headers=up.auth())).status_code == 201
        assert (await client.delete("/files/tester/dir", headers=up.auth())).status_code == 409  # not empty
        assert (await client.delete("/files/tester/dir/a.txt", headers=up.auth("other"))).status_code == 401
        assert (await client.delete("/files/tester/dir/a.txt", headers=up.auth())).status_code == 204
        assert (await client.delete("/files/tester/dir", headers=up.auth())).status_code == 204
        assert (await client.delete("/files/tester/dir", headers=up.auth())).status_code == 404
        through = await client.delete("/files/tester/out/keep.txt", headers=up.auth())
        assert through.status_code == 403
        link = await client.delete("/files/tester/out", headers=up.auth())
        assert link.status_code == 409
        assert (outside / "keep.txt").read_text() == "keep"
        assert _leftovers(up.work) == ["out"]

    _run(short, body)
