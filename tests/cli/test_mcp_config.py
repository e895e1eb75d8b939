"""`handler mcp-config PROFILE --url URL`: each host family's entry for the profile's MCP endpoint over HTTP, the
bearer token a reference to an environment variable, never its value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_each_host_family_gets_its_own_form_with_the_token_read_from_the_environment(
        shipped_tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDLER_TOKEN", "hst_the-real-token-never-printed")
    url = "https://mcp.example.org/"

    def entry(host: str) -> dict[str, object]:
        code, out, err = _run(capsys, "mcp-config", "researcher", "--root", str(shipped_tree), "--url", url,
                              "--host", host)
        assert (code, err) == (0, "")
        document: dict[str, object] = json.loads(out)
        return document

    endpoint = "https://mcp.example.org/mcp/researcher"
    assert entry("claude-code") == {"mcpServers": {"handler-researcher": {
        "type": "http", "url": endpoint, "headers": {"Authorization": "Bearer ${HANDLER_TOKEN}"}}}}
    assert entry("vscode") == {"servers": {"handler-researcher": {
        "type": "http", "url": endpoint, "headers": {"Authorization": "Bearer ${env:HANDLER_TOKEN}"}}}}
    assert entry("cursor") == {"mcpServers": {"handler-researcher": {
        "url": endpoint, "headers": {"Authorization": "Bearer ${env:HANDLER_TOKEN}"}}}}
    assert entry("generic") == {"type": "http", "url": endpoint,
                                "headers": {"Authorization": "Bearer ${HANDLER_TOKEN}"}}

    code, out, _ = _run(capsys, "mcp-config", "researcher", "--root", str(shipped_tree), "--url", endpoint,
                        "--token-env", "RESEARCHER_TOKEN")
    assert code == 0
    assert "hst_the-real-token" not in out
    assert [line for line in out.splitlines() if line.startswith("# ")] == [
        "# claude-code: .mcp.json (Claude Code expands ${VAR} from its environment)",
        "# vscode: .vscode/mcp.json (VS Code expands ${env:VAR})",
        "# cursor: ~/.cursor/mcp.json or .cursor/mcp.json (Cursor expands ${env:VAR})",
        "# generic: the generic form, for any host that takes a URL and headers"]
    assert out.count(endpoint) == 4  # an endpoint URL given whole is not extended again
    assert out.count("RESEARCHER_TOKEN") == 4


@pytest.mark.parametrize(("argv", "said"), [
    (("--url", "https://x", "--host", "claude-desktop"), "Connectors settings"),
    (("--url", "mcp.example.org"), "is not an http(s) address"),
    (("--url", "https://x", "--token-env", "A-B"), "is not the name of an environment variable"),
    (("--host", "generic"), "give --url too"),
])
def test_what_cannot_make_a_remote_entry_is_refused_saying_why(
        shipped_tree: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], said: str) -> None:
    code, out, err = _run(capsys, "mcp-config", "researcher", "--root", str(shipped_tree), *argv)
    assert (code, out) == (1, "")
    assert said in err
