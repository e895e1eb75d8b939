"""An unmodified MCP server from PyPI (mcp-server-fetch) served under web-fetch/v1's names and shapes."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.config.models import WrapSpec
from reconciler.connectors.client import ConnectorProcess, LaunchSpec
from reconciler.connectors.sandbox import confined_env
from reconciler.connectors.wrapping import WrappedConnector
from tests.fixtures.loopback import QuietHandler, serving_http

WRAP = WrapSpec(
    tools={"web_fetch_get": "fetch"}, arguments={"maxLength": "max_length"}, reshape="text", error="fetch_failed"
)
PAGE = (
    b"<html><head><title>Invoice help</title></head><body><h1>Paying an invoice</h1>"
    b"<p>Quote the number INV-2024-0042 with every payment.</p></body></html>"
)


@pytest.fixture
def site() -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path != "/help":
                self.send_error(404)
                return
            self.send_body(200, PAGE, "text/html")

    with serving_http(Handler) as url:
        yield url


def _fetch(tmp_path: Path, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        command = (sys.executable, "-m", "mcp_server_fetch", "--ignore-robots-txt", "--allow-private-ips")
        spec = LaunchSpec(name="web-fetch-test", command=command, cwd=str(tmp_path), env=confined_env({}, tmp_path))
        connector = WrappedConnector(ConnectorProcess(spec), WRAP)
        try:
            return [await connector.call_tool("web_fetch_get", args) for args in calls]
        finally:
            await connector.stop()

    return asyncio.run(asyncio.wait_for(go(), 60))


def test_a_page_is_fetched_renamed_and_reshaped_and_failures_keep_the_closed_list(site: str, tmp_path: Path) -> None:
    page, missing = _fetch(tmp_path, [{"url": f"{site}/help", "maxLength": 2000}, {"url": f"{site}/nowhere"}])
    assert page["isError"] is False
    assert set(page["structuredContent"]) == {"text"}
    assert "INV-2024-0042" in page["structuredContent"]["text"]
    assert missing["isError"] is True
    assert missing["structuredContent"]["error"] == "fetch_failed"
    assert "404" in missing["structuredContent"]["message"]
