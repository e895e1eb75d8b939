"""The client matrix, as hosts run a profile: every server `handler mcp-config` writes, at once, in one client.

Each host (the TypeScript SDK, the Python SDK 1.x and 2.x in both eras, openai-agents with no model) starts the
`handler` entry and one entry per interface: no tool name comes twice (openai-agents refused to start on a
duplicate), each interface's skill is readable as a resource and a prompt and its summary arrives in the
server's `instructions`, and a tool of each server is called. A binding whose secret is missing answers every
client `unavailable` with `handler/retry = never` and words that name neither vendor nor secret; `handler call`
prints the cause and exits 5; the owner is emailed once however many calls fail (docs/router.md "Retrying").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from reconciler.governance.alerts import list_alerts
from reconciler.governance.notices import list_notices
from reconciler.governance.store import open_store, store_url
from tests.fixtures.echo_fixtures import SECRET
from tests.fixtures.echo_tree import SKILL, SKILL_DESCRIPTION, TOKEN_ENV
from tests.fixtures.harness import DEADLINE
from tests.fixtures.mail import Mailbox, serving_mailbox
from tests.fixtures.matrix import (
    HANDLER,
    HOST_KINDS,
    PARROT_DESCRIPTION,
    PARROT_SKILL,
    GovernedService,
    HostProcess,
    governed_service,
    host_command,
    profile_config,
    wait_until,
    write_governed_tree,
)

NOT_SET_UP = "this service is not set up on this machine; an owner has been told; retrying will not help"


@pytest.fixture(scope="module")
def service() -> Iterator[GovernedService]:
    with governed_service() as running:
        yield running


@contextlib.contextmanager
def hosting(kind: str, config: Path, env: dict[str, str]) -> Iterator[HostProcess]:
    host = HostProcess(host_command(kind), config, env)
    try:
        yield host
    finally:
        said = host.close()
        assert "Traceback" not in said, said


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_every_host_gets_each_skill_one_copy_of_each_tool_and_calls_every_server(
        kind: str, service: GovernedService, tmp_path: Path) -> None:
    with hosting(kind, profile_config(service, tmp_path), service.env) as host:
        contract = host.contract()
        servers = contract["servers"]
        assert list(servers) == ["handler", "echo", "parrot"]
        names = [name for server in servers.values() for name in server["tools"]]
        assert len(names) == len(set(names)), names  # no tool name in two servers
        assert servers["handler"]["tools"] == ["handler_status", "handler_decide"]
        assert servers["parrot"]["tools"] == ["parrot_say"]
        assert "handler_status" not in servers["echo"]["tools"]
        if kind == "openai-agents":  # the agent takes every server's tools: it raised on a duplicate before
            assert sorted(contract["agent_tools"]) == sorted(names)

        for name, key, text, summary in (("echo", "echo/v1", SKILL, SKILL_DESCRIPTION),
                                         ("parrot", "parrot/v1", PARROT_SKILL, PARROT_DESCRIPTION)):
            server = servers[name]
            assert server["resources"] == [f"handler://skills/{key}"]
            assert server["skill"] == text
            assert server["prompts"] == [f"{name}-v1"]
            assert summary in server["instructions"], server["instructions"]
            assert f"the resource handler://skills/{key} (resources/read)" in server["instructions"]
        assert servers["handler"]["resources"] == []
        assert "handler_status" in servers["handler"]["instructions"]

        said = host.call("echo", "echo_say", {"text": f"from {kind}"})
        assert said.get("structuredContent") == {"text": f"from {kind}"}, said
        repeated = host.call("parrot", "parrot_say", {"text": "again", "upper": True})
        assert repeated["structuredContent"] == {"text": "AGAIN"}
        status = host.call("handler", "handler_status", {"request_id": "req_nothing"})
        assert status["structuredContent"]["status"] == "unknown"


class UnreadyService:
    """`handler up` on the governed tree with the binding's secret missing from its environment, and its owner's
    email on a real SMTP server on loopback."""

    def __init__(self, base: Path, smtp_port: int) -> None:
        self.root = write_governed_tree(base / "t")
        self.run_dir = base / "run"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", TOKEN_ENV) and not k.startswith("HANDLER_")}
        self.env.update({"HANDLER_RUN_DIR": str(self.run_dir), "HANDLER_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}"})
        self.proc = subprocess.Popen([HANDLER, "up", str(self.root), "--http", "127.0.0.1:0"], stderr=subprocess.PIPE,
                                     text=True, env=self.env)
        assert self.proc.stderr is not None
        self.said: list[str] = []
        for line in self.proc.stderr:
            self.said.append(line)
            if "Ctrl-C" in line:
                break
        self._drain = threading.Thread(target=self.said.extend, args=(self.proc.stderr,), daemon=True)
        self._drain.start()
        assert self.proc.poll() is None, "".join(self.said)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drain.join(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def test_a_binding_without_its_secret_says_retrying_will_not_help_and_its_owner_is_told_once() -> None:
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="h"))  # short: unix socket paths hold ~107 bytes
    try:
        with serving_mailbox() as (box, port):
            up = UnreadyService(base, port)
            try:
                failed = _fail_from_every_side(up, base)
                store = open_store(store_url(str(up.root)), migrate=False)
                try:
                    alert = wait_until(lambda: next((a for a in list_alerts(store) if a.calls >= failed), None),
                                       "every failed call counted on the binding's alert")
                    wait_until(lambda: _alerts_mailed(box), "the owner's email")
                    assert len(list_alerts(store)) == 1  # one cause
                    assert [(n.target, n.state) for n in list_notices(store, alert.id)] == [
                        ("owner@example.org", "sent")]
                finally:
                    store.close()
                status = subprocess.run([HANDLER, "status", "--root", str(up.root)], capture_output=True, text=True,
                                        timeout=DEADLINE, env=up.env, check=False)
                assert (f"not set up: binding echo-local cannot start, {failed} calls failed on it (its owners were "
                        f"told once): binding 'echo-local': secret slot 'token': the router's environment has no "
                        f"{TOKEN_ENV}") in status.stdout.splitlines(), status.stdout
            finally:
                up.stop()
        mailed = _alerts_mailed(box)  # the held call's approval email aside
        assert len(mailed) == 1, [m["Subject"] for m in box.messages]  # however many calls failed
        mail = mailed[0]
        assert mail["To"] == "owner@example.org"
        assert "binding echo-local cannot start" in mail["Subject"]
        text = mail.get_body().get_content()  # type: ignore[union-attr]
        assert f"the router's environment has no {TOKEN_ENV}" in text  # the owner is told what is missing
        assert SECRET not in text
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _alerts_mailed(box: Mailbox) -> list[EmailMessage]:
    return [m for m in box.messages if str(m["Subject"]).startswith("Not set up:")]


def _fail_from_every_side(up: UnreadyService, base: Path) -> int:
    """Calls from two hosts and `handler call`, each answered as not set up; how many failed."""
    failed = 0
    config = base / "mcp.json"
    done = subprocess.run([HANDLER, "mcp-config", "tester", "--root", str(up.root), "--run-dir", str(up.run_dir)],
                          capture_output=True, text=True, timeout=60, env=up.env, check=True)
    config.write_text(done.stdout)
    for kind in ("typescript", "openai-agents"):
        with hosting(kind, config, up.env) as host:
            for server, tool in (("echo", "echo_say"), ("parrot", "parrot_say"), ("echo", "echo_say")):
                result = host.call(server, tool, {"text": "x"})
                assert result["isError"] is True
                assert json.loads(result["content"][0]["text"]) == {"error": "unavailable", "message": NOT_SET_UP}
                meta: dict[str, Any] = result["_meta"]
                assert (meta["handler/retry"], meta["handler/cause"]) == ("never", "not_set_up")
                assert "echo-local" not in json.dumps(result)
                assert TOKEN_ENV not in json.dumps(result)
                failed += 1
    with hosting("python-sdk-2-auto", config, up.env) as host:  # a held call, approved: its run fails the same way
        held = host.call("echo", "echo_write", {"text": "x", "outputPath": "x.txt"})
        assert held["_meta"]["handler/retry"] == "after_decision"
        rid = held["_meta"]["handler/requestId"]
        approved = subprocess.run([HANDLER, "approvals", "approve", rid, "--as", "owner", "--root", str(up.root)],
                                  capture_output=True, text=True, timeout=DEADLINE, env=up.env, check=False)
        assert approved.returncode == 0, approved.stderr

        def ended() -> dict[str, Any] | None:
            status = host.call("handler", "handler_status", {"request_id": rid})["structuredContent"]
            return None if status["status"] == "pending" else status

        outcome = wait_until(ended, f"hold {rid} to run")
        assert outcome["status"] == "failed"
        assert outcome["message"] == (f"Approved by owner; the run failed: {NOT_SET_UP}. This is final: the hold is "
                                      "never run again.")
        failed += 1
    for _ in range(2):
        called = subprocess.run([HANDLER, "call", "echo", "echo_say", "--profile", "tester", "--text", "x",
                                 "--run-dir", str(up.run_dir), "--root", str(up.root)], capture_output=True,
                                text=True, timeout=DEADLINE, env=up.env, check=False)
        assert called.returncode == 5, called.stderr
        assert called.stderr.splitlines() == [
            f"handler call: unavailable: {NOT_SET_UP} (cause not_set_up; retry never; `handler status` names what "
            "is missing)"]
        failed += 1
    return failed
