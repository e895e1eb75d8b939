"""A fresh clone as a new user meets it: the README's run command, then a real call through `handler-service` to
each of ocr, tts, transcribe, embed, web-fetch and send-email in the example profiles, each executed (a held
call after an owner approves it with the CLI). The README's first `handler call` runs as written, read from it.

What an operator would point at this machine's own servers is pointed so, in the clone, as an operator would:
the email binding at an SMTP server the test starts (on port 2525, its CA written in the binding, its password
from a `pass` stand-in on PATH), the web-fetch binding's egress at a page server the test starts. Nothing else of the
example tree changes. The README's command is read from the README itself, not copied here.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import AuthResult, LoginPassword
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.fixtures.harness import short_dir
from tests.fixtures.loopback import QuietHandler, serve_on
from tests.fixtures.mail import Mailbox, self_signed, starttls_server

REPO = Path(__file__).resolve().parents[2]
SMTP_HOST, PAGES_HOST = "127.0.58.21", "127.0.58.22"  # addresses of their own (root, as CI)
SMTP_PORT = 2525  # a private mail server on a port of its own, as an operator's often is
PASSWORD = "stand-in-app-password"  # noqa: S105 - what the `pass` stand-in prints
DEADLINE = 600.0  # the README's install included


def _readme_run_command() -> str:
    text = (REPO / "README.md").read_text()
    found = re.search(r"\*\*Run it\*\*.*?```sh\n(.*?)\n```", text, re.S)
    assert found is not None, "the README's run command"
    return found.group(1).strip()


def _readme_first_call() -> str:
    """The README's first call of a tool from a script: its sh block that runs `handler call`."""
    blocks = re.findall(r"```sh\n(.*?)\n```", (REPO / "README.md").read_text(), re.S)
    found = [b for b in blocks if "handler call " in b]
    assert found, "the README's first call"
    return found[0].strip()


class _Pages(QuietHandler):
    def do_GET(self) -> None:
        if self.path == "/robots.txt":  # none: fetching is allowed
            self.send_error(404)
            return
        page = b"<html><body><article><h1>Fresh clone</h1><p>The quarterly report is due on Friday.</p>" \
               b"</article></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)


def _operator_edits(clone: Path, cert: Path, stub_bin: Path) -> None:
    """What an operator of this machine changes in the example tree, in its config only: where mail goes (a
    private server on its own port, its CA written in the binding) and where pages are."""
    email = clone / "config/bindings/email-smtp.toml"
    email.write_text(email.read_text().replace(
        'host = "smtp.example.org", port = "587"',
        f'host = "{SMTP_HOST}", port = "{SMTP_PORT}", ca_certificates = """{cert.read_text()}"""',
    ).replace('"smtp.example.org:587"', f'"{SMTP_HOST}:{SMTP_PORT}"'))
    fetch = clone / "config/bindings/web-fetch-public.toml"
    fetch.write_text(fetch.read_text().replace('egress = ["*:80", "*:443"]', f'egress = ["{PAGES_HOST}:80"]'))
    stub_bin.mkdir()
    (stub_bin / "pass").write_text(f"#!/bin/sh\necho {PASSWORD}\n")  # `pass show mail/agents-smtp`
    (stub_bin / "pass").chmod(0o755)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Mailbox, Path]]:
    with short_dir() as folder:
        certificate = self_signed(folder, SMTP_HOST)
        mailbox = Mailbox()
        with starttls_server(mailbox, SMTP_HOST, SMTP_PORT, certificate, _login), serve_on((PAGES_HOST, 80), _Pages):
            yield mailbox, certificate[0]


def _login(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
    ok = isinstance(data, LoginPassword) and data.login == b"agents@example.org" and data.password == PASSWORD.encode()
    return AuthResult(success=ok, handled=False)


async def _call(clone: Path, run_dir: Path, profile: str, interface: str, tool: str,
                arguments: dict[str, Any]) -> dict[str, Any]:
    """One call through the bridge `handler mcp-config` names for the profile, as an MCP host makes it; a held
    call is approved by an owner with the CLI, then polled with handler_status until it ran."""
    config = subprocess.run([str(clone / ".venv/bin/handler"), "mcp-config", profile, "--root", str(clone),
                             "--run-dir", str(run_dir)], capture_output=True, text=True, check=True, timeout=60)
    servers = json.loads(config.stdout)["mcpServers"]
    entry, builtins = servers[interface], servers["handler"]  # handler_status is the `handler` entry's alone
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])
    held_params = StdioServerParameters(command=builtins["command"], args=builtins["args"], env=builtins["env"])
    async with Client(params) as client, Client(held_params) as handler:
        result = await client.call_tool(tool, arguments)
        meta = result.meta or {}
        if meta.get("handler/status") == "pending":
            rid = str(meta["handler/requestId"])
            approve = subprocess.run([str(clone / ".venv/bin/handler"), "approvals", "approve", rid, "--as", "alice",
                                      "--root", str(clone)], capture_output=True, text=True, timeout=60, check=False)
            assert approve.returncode == 0, approve.stderr
            for _ in range(600):
                status = await handler.call_tool("handler_status", {"request_id": rid})
                body = status.structured_content or json.loads(status.content[0].text)  # type: ignore[union-attr]
                if body["status"] != "pending":
                    assert body["status"] == "executed", body
                    return {"held": True, **body}
                await asyncio.sleep(0.1)
            raise AssertionError(f"{tool}: the approved call did not run")
        if result.is_error:
            status = subprocess.run([str(clone / ".venv/bin/handler"), "status", "--root", str(clone)],
                                    capture_output=True, text=True, timeout=60, check=False)
            logs = "".join(p.read_text()[-1500:] for p in (clone / ".handler/connectors").glob("*.stderr.log"))
            raise AssertionError(f"{tool}: {result.content}\n{status.stdout}\n{logs}")
        return {"held": False, "output": result.structured_content}


# The README's install, the service's start and six calls: the suite's 120 s bound ended it during the first call
# on a busy host; this bounds a hang, it times nothing.
@pytest.mark.timeout(2 * DEADLINE)
def test_a_fresh_clone_runs_every_local_capability_of_the_example(servers: tuple[Mailbox, Path]) -> None:
    mailbox, cert = servers
    with short_dir() as folder:
        clone, run_dir = folder / "clone", folder / "run"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
        _operator_edits(clone, cert, folder / "bin")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HANDLER_", "VIRTUAL_ENV"))}
        env.update(HANDLER_RUN_DIR=str(run_dir), PATH=f"{folder / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
        up = subprocess.Popen(["bash", "-c", _readme_run_command()], cwd=clone, env=env, stderr=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            _wait_until_serving(up)
            # The README's first call, as written: it puts the invoice in the work folder and reads it.
            first = subprocess.run(["bash", "-c", _readme_first_call()], cwd=clone, env=env, capture_output=True,
                                   text=True, timeout=120, check=False)
            assert first.returncode == 0, first.stderr
            assert first.stdout.count("INV-2024-0042") == 1, first.stdout
            outputs = asyncio.run(asyncio.wait_for(_every_capability(clone, run_dir), DEADLINE))
        finally:
            os.killpg(up.pid, signal.SIGINT)
            up.wait(timeout=60)
            assert up.stderr is not None
            up.stderr.close()
    assert "INV" in json.dumps(outputs["ocr"]).upper()  # the invoice's text was read
    assert "quarterly report" in json.dumps(outputs["web-fetch"]).lower()
    vectors = outputs["embed"]["output"]["vectors"]
    assert len(vectors) == 2
    assert outputs["tts"]["output"]["durationSeconds"] > 0.5
    assert outputs["transcribe"]["output"]["text"].strip()
    assert outputs["send-email"]["held"]  # every email waits for a person in the example
    (sent,) = [m for m in mailbox.messages if m["Subject"] == "From a fresh clone"]
    assert sent["To"] == "bob@example.org"


def _wait_until_serving(up: subprocess.Popen[str]) -> None:
    assert up.stderr is not None
    said = []
    started = time.monotonic()
    for line in up.stderr:
        said.append(line)
        if "Ctrl-C stops everything" in line:
            return
        assert time.monotonic() - started < DEADLINE, "".join(said)
    raise AssertionError("the README's run command ended before serving:\n" + "".join(said[-40:]))


async def _every_capability(clone: Path, run_dir: Path) -> dict[str, dict[str, Any]]:
    calls = [
        ("researcher", "ocr", "ocr_extract", {"path": "invoice.pdf"}),
        ("researcher", "web-fetch", "web_fetch_get", {"url": f"http://{PAGES_HOST}/report"}),
        ("researcher", "embed", "embed_texts", {"texts": ["a cat", "a kitten"]}),
        ("assistant", "tts", "tts_synthesize", {"text": "The quarterly report is due on Friday.",
                                                "outputPath": "brief.wav"}),
        ("assistant", "transcribe", "transcribe_audio", {"path": "brief.wav"}),
        ("assistant", "send-email", "send_email_send", {"to": ["bob@example.org"], "subject": "From a fresh clone",
                                                        "body": "Every capability of the example ran.\n"}),
    ]
    return {interface: await _call(clone, run_dir, profile, interface, tool, arguments)
            for profile, interface, tool, arguments in calls}
