"""An unmodified MCP server from PyPI (mcp-server-fetch) served under web-fetch/v1's names and shapes:
the wrap checked against the server's own tools/list at start, per-tool renames and fixed arguments,
and errors the model reads in the interface's words."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.check import check_connector
from reconciler.config.models import ConnectorFile, WrapSpec
from reconciler.connectors.client import ConnectorProcess, LaunchSpec
from reconciler.connectors.errors import ConnectorError, ConnectorReplyError, ConnectorStartError
from reconciler.connectors.sandbox import confined_env
from reconciler.connectors.wrapping import WrappedConnector, check_wrap
from tests.fixtures.harness import RawClient, run, serving, short_dir
from tests.fixtures.loopback import QuietHandler, serving_http

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "catalog/connectors/web-fetch-mcp/connector.toml"
WRAP = ConnectorFile.model_validate(tomllib.loads(MANIFEST.read_text())).wrap
FETCH_FAILED = "the page could not be fetched: the host refused, the address is wrong or not allowed"
TEXTS = {"fetch_failed": FETCH_FAILED, "unavailable": "the service is down or out of quota; retrying later may work"}
PAGE = (
    b"<html><head><title>Invoice help</title></head><body><h1>Paying an invoice</h1>"
    b"<p>Quote the number INV-2024-0042 with every payment.</p></body></html>"
)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path != "/help":
                self.send_error(404)
                return
            self.send_body(200, PAGE, "text/html")

    with serving_http(Handler) as url:
        yield url


def _server(folder: Path) -> ConnectorProcess:
    command = (sys.executable, "-m", "mcp_server_fetch", "--ignore-robots-txt", "--allow-private-ips")
    return ConnectorProcess(LaunchSpec(name="web-fetch-test", command=command, cwd=str(folder),
                                       env=confined_env({}, folder)))


def _fetch(tmp_path: Path, wrap: WrapSpec, calls: list[dict[str, Any]]) -> list[dict[str, Any] | Exception]:
    """Each call's result through the wrap, or the connector error it raised."""
    async def go() -> list[dict[str, Any] | Exception]:
        connector = WrappedConnector(_server(tmp_path), wrap, TEXTS)
        results: list[dict[str, Any] | Exception] = []
        try:
            for args in calls:
                try:
                    results.append(await connector.call_tool("web_fetch_get", args))
                except ConnectorError as exc:
                    results.append(exc)
            return results
        finally:
            await connector.stop()

    return asyncio.run(asyncio.wait_for(go(), 60))


def test_a_page_is_fetched_renamed_and_reshaped_and_errors_speak_the_interfaces_words(site: str,
                                                                                       tmp_path: Path) -> None:
    assert WRAP is not None
    page, short, missing, bad = _fetch(tmp_path, WRAP, [
        {"url": f"{site}/help", "maxLength": 2000}, {"url": f"{site}/help", "maxLength": 10},
        {"url": f"{site}/nowhere"}, {"url": ""}])
    assert isinstance(page, dict)
    assert page["isError"] is False
    assert set(page["structuredContent"]) == {"text"}
    assert "INV-2024-0042" in page["structuredContent"]["text"]
    assert "<p>" not in page["structuredContent"]["text"]  # raw is fixed to false: the readable text
    assert isinstance(short, dict)
    assert "INV-2024-0042" not in short["structuredContent"]["text"]  # maxLength reached max_length
    # The server's advice to pass a start_index, which web-fetch/v1 has not, is cut out ([wrap] drop).
    assert "start_index" not in short["structuredContent"]["text"], short
    assert "<error>" not in short["structuredContent"]["text"]
    # The server's 404 matched the tool's pattern: the model reads the interface's text, not the server's.
    assert isinstance(missing, dict)
    assert missing["structuredContent"] == {"error": "fetch_failed", "message": FETCH_FAILED}
    # The server refused an argument: no pattern maps it, so it is the router's unavailable, its text not kept.
    assert isinstance(bad, ConnectorError)
    assert bad.cause == "connector_error"
    assert "validation" not in bad.message


def test_without_drop_the_servers_advice_would_reach_the_model(site: str, tmp_path: Path) -> None:
    assert WRAP is not None
    kept = WRAP.model_copy(update={"tools": {"web_fetch_get": WRAP.tool("web_fetch_get").model_copy(
        update={"drop": []})}})
    (short,) = _fetch(tmp_path, kept, [{"url": f"{site}/help", "maxLength": 10}])
    assert isinstance(short, dict)
    assert "start_index" in short["structuredContent"]["text"]  # what the shipped wrap's drop removes


def test_a_fixed_argument_is_always_sent(site: str, tmp_path: Path) -> None:
    raw = WrapSpec.model_validate({"tools": {"web_fetch_get": {"tool": "fetch", "fixed": {"raw": True},
                                                               "reshape": "text"}}})
    (page,) = _fetch(tmp_path, raw, [{"url": f"{site}/help", "raw": False}])
    assert isinstance(page, dict)
    assert "<p>Quote the number" in page["structuredContent"]["text"]


def test_a_json_rpc_error_of_the_server_is_never_a_domain_error(tmp_path: Path) -> None:
    wrong = WrapSpec.model_validate({"tools": {"web_fetch_get": "get"}, "error": "fetch_failed"})
    (failed,) = _fetch(tmp_path, wrong, [{"url": "http://127.0.0.1:9/"}])
    assert isinstance(failed, ConnectorReplyError)  # the pipeline makes it unavailable (connector_error)
    assert failed.cause == "connector_error"


def test_the_wrap_is_held_against_the_servers_tools_list_naming_both_sides(tmp_path: Path) -> None:
    async def offered() -> list[dict[str, Any]]:
        process = _server(tmp_path)
        try:
            await process.ensure_started()
            return await process.list_tools()
        finally:
            await process.stop()

    tools = asyncio.run(asyncio.wait_for(offered(), 60))
    assert WRAP is not None
    takes = {"web_fetch_get": {"url", "maxLength"}}
    check_wrap("fetch-local", WRAP, takes, tools)  # the shipped wrap fits
    # A rename of [wrap] itself counts only for the tools that have the argument.
    check_wrap("fetch-local", WrapSpec(tools={"web_fetch_get": "fetch"}, arguments={"query": "q"}), takes, tools)
    wrong = WrapSpec.model_validate({"tools": {"web_fetch_get": {"tool": "fetch", "arguments": {"maxLength": "limit"},
                                                                 "fixed": {"html": True}}}})
    with pytest.raises(ConnectorStartError) as caught:
        check_wrap("fetch-local", wrong, takes, tools)
    said = caught.value.message
    assert "'web_fetch_get' renames its argument 'maxLength' to 'limit'" in said
    assert "fixes the argument 'html'" in said
    assert "its arguments: max_length, raw, start_index, url" in said
    with pytest.raises(ConnectorStartError, match=r"'web_fetch_get' maps to the server's tool 'get_page', which "
                       r"it does not offer \(it offers: fetch\)"):
        check_wrap("fetch-local", WrapSpec(tools={"web_fetch_get": "get_page"}), takes, tools)


def _tree_with_wrap(root: Path, server_tool: str) -> Path:
    """The shipped tree, web-fetch-mcp mapping web_fetch_get to `server_tool`, and a binding for researcher."""
    for part in ("catalog/interfaces", "catalog/connectors", "config"):
        shutil.copytree(REPO / part, root / part)
    manifest = root / "catalog/connectors/web-fetch-mcp/connector.toml"
    manifest.write_text(manifest.read_text().replace('tool = "fetch"', f'tool = "{server_tool}"'))
    (root / "config/bindings/fetch-local.toml").write_text(
        'apiVersion = "handler.binding/v1"\nname = "fetch-local"\nconnector = "web-fetch-mcp"\n'
        'egress = ["127.0.0.1:9"]\n')
    profile = root / "config/profiles/researcher.toml"
    profile.write_text(profile.read_text().replace('web-fetch = "web-fetch-public"', 'web-fetch = "fetch-local"'))
    return root


def test_a_wrap_mapping_a_missing_tool_fails_the_binding_at_start_and_the_check_at_once(
        capfd: pytest.CaptureFixture[str]) -> None:
    with short_dir() as folder:
        root = _tree_with_wrap(folder / "t", "get_page")

        async def scenario() -> None:
            async with serving(root, folder / "r") as router:
                client = await RawClient.connect(router.socket_path("researcher"))
                result = await client.call("web_fetch_get", {"url": "http://127.0.0.1:9/"})
                await client.close()
                assert result["isError"] is True
                assert result["_meta"]["handler/cause"] == "start_failed"
                status = router.services.pool.statuses["fetch-local"]
                assert status.state == "failed"
                assert "'web_fetch_get' maps to the server's tool 'get_page'" in status.message
                assert "it offers: fetch" in status.message

        run(scenario(), 90)
        code = check_connector("web-fetch-mcp", "fetch-local", root=root, examples=2, seed=1, record=False)
        out = capfd.readouterr().out
        assert code != 0, out
        assert "'web_fetch_get' maps to the server's tool 'get_page'" in out
