"""A hostile agent's runner tries the ways out a hostile connector tries; each is refused (docs/agents.md).

An agent run is code its host's author ships, run on the service's machine: the runner of the profile `runner`
is the hostile program (`tests/fixtures/hostile/`) run as a runner, started by the attacker's `agent_run`. It goes
for the store, the router's process and environment, the network, the mounts, the config tree, another profile's
socket and another binding's secret. Run against one `handler serve` per mode: as root (as CI runs) and as an
unprivileged user (nobody). Whatever it tries, the store, the tree and the secrets stay as they were.
"""

from __future__ import annotations

import json
import time
import tomllib
from typing import Any

import pytest

from tests.fixtures.hostile.routers import HostileRouter
from tests.fixtures.hostile.tree import tree_changes

pytestmark = pytest.mark.timeout(600)

# Every attack of the connector's suite that asks nothing of a connector's own plumbing (its call space, its
# kept files, its memory cap), each taken by the runner as the connector takes it.
ATTACKS = ["store", "router_environ", "environ_scan", "router_mem", "process_vm", "setns", "mount", "config_write",
           "shadow", "signal", "profile_socket", "postgres_socket", "loopback_tcp", "secret_file", "ptrace",
           "keyctl", "bpf", "perf_event_open", "write_usr", "write_code", "list_proc", "identity"]


def _body(result: Any) -> dict[str, Any]:
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, text
    found: dict[str, Any] = json.loads(text)
    return found


def _run_to_its_end(router: HostileRouter, asked: dict[str, Any]) -> dict[str, Any]:
    """Start a run of `runner` from the attacker's session and follow it until it ends."""
    run = _body(router.call("attacker", "agent_run", {"agent": "runner", "input": json.dumps(asked)}, "agent"))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = _body(router.call("attacker", "agent_status", {"run": run["run"]}, "agent"))
        if status["status"] != "running":
            return status
        time.sleep(0.5)
    raise AssertionError(f"run {run['run']} still running after 240 s\n{router.log_tail()}")


def test_a_hostile_runner_is_refused_every_way_out(router: HostileRouter) -> None:
    settings = tomllib.loads((router.root / "config/bindings/hostile-attacker.toml").read_text())["settings"]
    ended = _run_to_its_end(router, {"settings": settings, "attacks": ATTACKS, "target": str(router.pid)})
    assert ended["status"] == "succeeded", f"{ended}\n{router.log_tail()}"
    verdicts = json.loads(ended["result"])
    assert [v["name"] for v in verdicts] == ATTACKS
    escaped = {v["name"]: v["detail"] for v in verdicts if not v["refused"]}
    assert escaped == {}, f"as {router.mode}, the runner got out: {escaped}"
    assert tree_changes(router.root) == ""
