"""The call log: one JSON line per call with the fields of docs/architecture.md §6, and never a payload or a secret."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson
import pytest

from reconciler.router import calllog
from reconciler.router.calllog import CallLog, CallRecord
from reconciler.router.server import Router
from tests.fixtures.harness import RawClient, exchange, log_lines, log_text

FIELDS = {"time", "profile", "instance", "interface", "tool", "binding", "outcome", "error", "duration_ms", "cost",
          "generation"}


def test_the_log_holds_neither_the_secret_nor_an_argument_value(echo_root: Path, run_dir: Path,
                                                                echo_secret: str) -> None:
    argument = "ARGUMENT-VALUE-a81f"

    async def script(c: RawClient, router: Router) -> None:
        token = await c.call("echo_token", {})
        assert token["structuredContent"] == {"token": echo_secret}  # the secret reached the connector
        assert (await c.call("echo_say", {"text": argument}))["structuredContent"] == {"text": argument}
        await c.call("echo_say", {"text": 7, "upper": argument})  # refused: the message echoes it, the log must not
        await c.call("echo_misbehave", {"mode": "extra"})
        logged = log_text(router)
        assert echo_secret not in logged
        assert argument not in logged
        lines = log_lines(router)
        assert len(lines) == 4
        for line in lines:
            assert set(line) - {"cause", "field", "keyword", "request_id"} == FIELDS
            assert (line["profile"], line["interface"], line["binding"]) == ("tester", "echo/v1", "echo-local")
            assert line["time"].endswith("Z")
            assert line["duration_ms"] >= 0
        assert [(x["tool"], x["outcome"], x["error"]) for x in lines] == [
            ("echo_token", "executed", None), ("echo_say", "executed", None),
            ("echo_say", "error", "invalid_arguments"), ("echo_misbehave", "error", "unavailable")]

    exchange(echo_root, run_dir, script)


def test_the_log_is_private_to_its_owner(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        await c.call("echo_say", {"text": "x"})
        router.services.log.flush()
        assert router.services.log.path is not None
        assert router.services.log.path.stat().st_mode & 0o777 == 0o600
        assert router.services.log.path == echo_root / ".handler/calls.jsonl"

    exchange(echo_root, run_dir, script)


def test_every_line_spells_the_interface_name_slash_version(echo_root: Path, run_dir: Path) -> None:
    """Executed, refused (an unknown tool) and built-in calls alike, whichever name the caller used."""
    async def script(c: RawClient, router: Router) -> None:
        await c.call("echo_say", {"text": "x"}, _meta={"handler/interface": "echo"})
        await c.call("echo_shout", {"text": "x"}, _meta={"handler/interface": "echo"})
        await c.call("echo_say", {"text": 1}, _meta={"handler/interface": "echo/v1"})
        await c.call("handler_status", {"request_id": "r-1"}, _meta={"handler/interface": "handler"})
        assert [(x["tool"], x["outcome"], x["interface"]) for x in log_lines(router)] == [
            ("echo_say", "executed", "echo/v1"), ("echo_shout", "refused", "echo/v1"),
            ("echo_say", "error", "echo/v1"), ("handler_status", "executed", "handler/v1")]

    exchange(echo_root, run_dir, script)


def test_a_log_moved_aside_by_logrotate_is_followed_by_a_fresh_one(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        log = router.services.log
        assert log.path is not None
        await c.call("echo_say", {"text": "before"})
        log.flush()
        rotated = log.path.with_name("calls.jsonl.1")
        log.path.rename(rotated)  # what `logrotate` does (without copytruncate), while the router runs
        await c.call("echo_say", {"text": "after"})
        log.flush()
        assert [line.count("\n") for line in (rotated.read_text(), log.path.read_text())] == [1, 1]
        assert log.path.stat().st_mode & 0o777 == 0o600
        log.path.unlink()  # removed outright: the next batch starts the file again
        await c.call("echo_say", {"text": "again"})
        log.flush()
        assert log.path.read_text().count("\n") == 1

    exchange(echo_root, run_dir, script)


def _record(tool: str) -> CallRecord:
    return CallRecord("tester", "", "echo/v1", tool, "echo-local", 1, time.perf_counter())


def _log_losing_its_folder(tmp_path: Path, *written: CallRecord) -> tuple[Path, CallLog]:
    """A call log (no loop: each write is flushed at once) that wrote `written`, then whose state folder was
    removed under it: nothing can be written until the folder is back."""
    state = tmp_path / "state"
    log = CallLog(state / "calls.jsonl", flush_seconds=0)
    for record in written:
        log.write(record)
    (state / "calls.jsonl").unlink()
    state.rmdir()
    return state, log


def _tools(state: Path) -> list[str]:
    return [orjson.loads(line)["tool"] for line in (state / "calls.jsonl").read_bytes().splitlines()]


def test_lines_that_cannot_be_written_wait_for_the_folder_and_are_said_once(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    state, log = _log_losing_its_folder(tmp_path, _record("first"))
    with caplog.at_level(logging.WARNING, logger="handler.router"):
        for n in range(3):
            log.write(_record(f"waiting-{n}"))
        state.mkdir()
        log.write(_record("last"))
    log.close()
    tools = _tools(state)
    assert tools == ["waiting-0", "waiting-1", "waiting-2", "last"]  # none lost, in order
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert said[0].startswith(f"cannot write the call log {state / 'calls.jsonl'} (No such file or directory)")
    assert said[1] == f"the call log {state / 'calls.jsonl'} is written again"


def test_past_its_bound_the_oldest_waiting_lines_go_and_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(calllog, "MOST_UNWRITTEN", 1000)
    state, log = _log_losing_its_folder(tmp_path)
    with caplog.at_level(logging.WARNING, logger="handler.router"):
        for n in range(20):
            log.write(_record(f"waiting-{n:02d}"))
        state.mkdir()
        log.write(_record("last"))
    log.close()
    tools = _tools(state)
    assert tools[-1] == "last"
    kept = len(tools) - 1
    assert 0 < kept < 20
    assert tools[:-1] == [f"waiting-{n:02d}" for n in range(20 - kept, 20)]  # the newest, whole lines
    assert caplog.records[-1].getMessage().endswith(f"; {20 - kept} lines were lost meanwhile")
