"""The egress proxy on its own: a name is resolved and its address checked before anything is dialled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.connectors import egress
from reconciler.connectors.egress import EgressProxy
from tests.fixtures.harness import short_dir
from tests.fixtures.loopback import serving_page


@pytest.fixture
def local_port() -> Iterator[int]:
    with serving_page(b"only for this machine") as url:
        yield int(url.rstrip("/").rsplit(":", 1)[1])


async def _connect_through(entries: list[str], target: str, folder: Path) -> tuple[str, list[str]]:
    """CONNECT `target` through a proxy allowing `entries`; the proxy's status line and what it refused."""
    proxy = EgressProxy(folder / "egress.sock", entries, owner="hostile")
    await proxy.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        await writer.drain()
        status = (await asyncio.wait_for(reader.readline(), 20)).decode().strip()
        writer.close()
        return status, list(proxy.refused)
    finally:
        await proxy.aclose()


@pytest.mark.parametrize("target", ["127.0.0.1:5432", "localhost:5432", "[::1]:5432", "0.0.0.0:5432"])
def test_a_wildcard_egress_does_not_reach_this_machine_postgresql_included(target: str) -> None:
    with short_dir() as folder:
        status, refused = asyncio.run(_connect_through(["*:*"], target, folder))
    assert status.startswith("HTTP/1.1 403"), status
    assert refused == [target]


@pytest.mark.parametrize("target", ["[64:ff9b::7f00:1]", "[64:ff9b:1::7f00:1]", "[::127.0.0.1]", "[::ffff:127.0.0.1]",
                                    "[2002:7f00:1::1]", "[2001::7f00:1]", "[fec0::1]"])
def test_an_ipv6_form_embedding_an_allowed_loopback_address_is_not_that_address(target: str, local_port: int) -> None:
    """An entry naming 127.0.0.1 allows that address alone: no translator's or tunnel's form of it."""
    with short_dir() as folder:
        status, refused = asyncio.run(_connect_through([f"127.0.0.1:{local_port}", "*:*"], f"{target}:{local_port}",
                                                       folder))
    assert status.startswith("HTTP/1.1 403"), status
    assert refused == [f"{target}:{local_port}"]


def test_a_loopback_server_named_by_its_exact_address_is_reached(local_port: int) -> None:
    with short_dir() as folder:
        status, refused = asyncio.run(_connect_through([f"127.0.0.1:{local_port}"], f"127.0.0.1:{local_port}",
                                                       folder))
    assert status.startswith("HTTP/1.1 200"), status
    assert refused == []


def test_a_name_resolving_to_loopback_is_refused_even_when_the_name_is_allowed(local_port: int) -> None:
    with short_dir() as folder:
        status, _ = asyncio.run(_connect_through([f"localhost:{local_port}"], f"localhost:{local_port}", folder))
    assert status.startswith("HTTP/1.1 403"), status


async def _status(reader: asyncio.StreamReader) -> str:
    return (await asyncio.wait_for(reader.readline(), 20)).decode().strip()


def test_a_connector_holding_too_many_connections_through_its_proxy_is_answered_503(
        caplog: pytest.LogCaptureFixture) -> None:
    """Each connection costs the router two descriptors: a connector may not hold more than its share."""
    async def scenario(folder: Path) -> None:
        proxy = EgressProxy(folder / "egress.sock", ["example.com:443"], owner="hostile")
        await proxy.start()
        held = []
        try:
            for _ in range(egress.MAX_CONNECTIONS):  # each waits for its request's head
                held.append(await asyncio.open_unix_connection(str(proxy.socket_path)))
            reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
            assert (await _status(reader)).startswith("HTTP/1.1 503")
            writer.close()
            _, first = held.pop(0)
            first.close()  # one less: the next is served (and refused for where it goes, not for how many)
            for _ in range(100):  # as soon as the proxy has seen the close
                reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
                writer.write(b"CONNECT 10.0.0.1:22 HTTP/1.1\r\n\r\n")
                status = await _status(reader)
                writer.close()
                if not status.startswith("HTTP/1.1 503"):
                    break
                await asyncio.sleep(0.05)
            assert status.startswith("HTTP/1.1 403"), status
        finally:
            for _, writer in held:
                writer.close()
            await proxy.aclose()

    with short_dir() as folder, caplog.at_level(logging.WARNING, logger="handler.egress"):
        asyncio.run(scenario(folder))
    assert sum("the most it may" in r.getMessage() for r in caplog.records) == 1


def test_a_request_head_that_never_comes_is_answered_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "HEAD_SECONDS", 0.2)

    async def scenario(folder: Path) -> None:
        proxy = EgressProxy(folder / "egress.sock", ["example.com:443"], owner="hostile")
        await proxy.start()
        try:
            reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
            writer.write(b"CONNECT example.com:443 HTTP/1.1\r\n")  # and nothing more
            assert (await _status(reader)).startswith("HTTP/1.1 408")
            writer.close()
        finally:
            await proxy.aclose()

    with short_dir() as folder:
        asyncio.run(scenario(folder))


def test_only_the_first_refusals_are_logged_one_by_one_and_all_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(folder: Path) -> EgressProxy:
        proxy = EgressProxy(folder / "egress.sock", ["example.com:443"], owner="hostile")
        await proxy.start()
        try:
            for n in range(30):
                reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
                writer.write(f"CONNECT 10.0.0.{n}:22 HTTP/1.1\r\n\r\n".encode())
                assert (await _status(reader)).startswith("HTTP/1.1 403")
                writer.close()
        finally:
            await proxy.aclose()
        return proxy

    with short_dir() as folder, caplog.at_level(logging.WARNING, logger="handler.egress"):
        proxy = asyncio.run(scenario(folder))
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("egress refused")]
    assert len(logged) == egress.LOGGED_REFUSALS
    assert logged[-1].endswith("its further refusals are counted, not logged")
    assert proxy.refusals == 30
    assert proxy.refused[-1] == "10.0.0.29:22"


@pytest.mark.parametrize("target", ["CONNECT 8.8.8.8:99999", "CONNECT 8.8.8.8:-1", "CONNECT 8.8.8.8:0",
                                    "CONNECT 8.8.8.8:+443", "CONNECT 8.8.8.8", "GET http://8.8.8.8:99999/",
                                    "GET http://8.8.8.8:0/", "GET http://8.8.8.8:abc/"])
def test_a_port_out_of_range_or_not_a_number_is_answered_400(target: str) -> None:
    async def scenario(folder: Path) -> str:
        proxy = EgressProxy(folder / "egress.sock", ["*:*"], owner="hostile")
        await proxy.start()
        try:
            reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
            writer.write(f"{target} HTTP/1.1\r\n\r\n".encode())
            status = await _status(reader)
            writer.close()
            return status
        finally:
            await proxy.aclose()

    with short_dir() as folder:
        assert asyncio.run(scenario(folder)).startswith("HTTP/1.1 400")
