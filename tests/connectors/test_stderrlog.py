"""A connector's stderr: masked, metered so a flood cannot swamp the router, rotated so it cannot fill the disk."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reconciler.connectors import stderrlog
from reconciler.connectors.stderrlog import StderrLog
from tests.fixtures.echo_connector import FLOOD_BYTES
from tests.fixtures.harness import RawClient, run, serving


class Clock:
    """The metering tests' clock: the budget refills only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_each_line_is_logged_and_appended_with_secrets_masked(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "b.stderr.log"
    sink = StderrLog("b", ["s3cret-token"], path)
    with caplog.at_level(logging.INFO, logger="handler.connector"):
        sink.feed(b"starting\nusing s3cret-tok")
        sink.feed(b"en now\n\n")
    assert lines_of(path) == ["starting", "using *** now"]
    assert [r.getMessage() for r in caplog.records] == ["connector of binding 'b': starting",
                                                         "connector of binding 'b': using *** now"]
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_file_that_cannot_be_written_is_said_once_and_the_lines_still_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gone" / "b.stderr.log"  # its folder removed under the router
    sink = StderrLog("b", [], path)
    with caplog.at_level(logging.INFO, logger="handler.connector"):
        sink.feed(b"one\ntwo\n")
        sink.feed(b"three\n")
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.startswith("cannot write")] == [
        f"cannot write {path} (No such file or directory): the stderr of binding 'b' goes only to this log "
        "until it can"]
    assert [m.rsplit(": ", 1)[1] for m in messages if m.startswith("connector of")] == ["one", "two", "three"]
    path.parent.mkdir()
    sink.feed(b"four\n")
    assert lines_of(path) == ["four"]


def test_the_file_is_rotated_at_its_size_keeping_one_before_it(tmp_path: Path) -> None:
    path = tmp_path / "b.stderr.log"
    sink = StderrLog("b", [], path, file_bytes=1000, burst_bytes=1 << 20)
    for n in range(100):
        sink.feed(f"line {n:03d} {'.' * 40}\n".encode())  # 50 bytes a line: 20 to a file
    older = path.with_name("b.stderr.log.1")
    assert path.stat().st_size <= 1000
    assert older.stat().st_size <= 1000
    assert not path.with_name("b.stderr.log.2").exists()
    assert lines_of(path)[-1].startswith("line 099")
    kept = [line.split()[1] for line in lines_of(older) + lines_of(path)]
    assert kept == [f"{n:03d}" for n in range(100 - len(kept), 100)]  # the newest, in order, none lost between
    assert older.stat().st_mode & 0o777 == 0o600


def test_a_flood_is_dropped_past_its_budget_said_once_and_counted_when_it_slows(
        tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "b.stderr.log"
    sink = StderrLog("b", [], path, burst_bytes=4096, rate_bytes=1024, clock=clock)
    chunk = b"".join(b"noise %05d\n" % n for n in range(1000))  # 11,000 bytes
    with caplog.at_level(logging.INFO, logger="handler.connector"):
        sink.feed(b"before\n")
        for _ in range(50):
            sink.feed(chunk)
        clock.now += 10  # it slowed down: the budget is back
        sink.feed(b"after\n")
    logged = lines_of(path)
    assert logged[0] == "before"
    assert "more stderr than 1 KiB a second" in logged[1]
    assert "dropped until it slows down" in logged[1]
    assert logged[2] == f"[handler: {50 * len(chunk):,} bytes of this connector's stderr were dropped, more than " \
                        "1 KiB a second after a burst of 4 KiB]"
    assert logged[3:] == ["after"]
    assert len(caplog.records) == 4  # the router's log is spared the flood too


def test_a_line_cut_by_dropping_is_not_logged_half(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "b.stderr.log"
    sink = StderrLog("b", [], path, burst_bytes=100, rate_bytes=100, clock=clock)
    sink.feed(b"whole line\nthe start of a long ")  # logged: the whole line; the rest waits for its end
    sink.feed(b"y" * 500)  # over the budget: dropped, with the start held
    clock.now += 10
    sink.feed(b"yyy the end of it\nnext line\n")
    logged = lines_of(path)
    assert logged[0] == "whole line"
    assert "dropped until it slows down" in logged[1]
    assert logged[2].startswith("[handler: 538 bytes of this connector's stderr were dropped")  # 20 + 500 + 18
    assert logged[3:] == ["next line"]


def test_when_a_flooding_process_ends_its_last_lines_are_logged(tmp_path: Path, clock: Clock) -> None:
    """What a process wrote last is most often why it stopped: kept even when it came within a flood."""
    path = tmp_path / "b.stderr.log"
    sink = StderrLog("b", ["s3cret"], path, burst_bytes=4096, rate_bytes=1024, clock=clock)
    noise = b"".join(b"noise %05d\n" % n for n in range(1000))
    last = b"Traceback (most recent call last):\nValueError: bad token s3cret\n"
    for _ in range(19):
        sink.feed(noise)
    sink.feed(noise + last)  # its last words in the flood's last chunk
    sink.feed(b"")  # the process ended
    logged = lines_of(path)
    assert "dropped until it slows down" in logged[0]
    assert logged[1].startswith(f"[handler: {20 * len(noise) + len(last):,} bytes of this connector's stderr were "
                                "dropped")
    assert logged[2] == "[handler: the last lines it wrote, dropped above:]"
    assert logged[-2:] == ["Traceback (most recent call last):", "ValueError: bad token ***"]
    assert all(line.startswith("noise ") for line in logged[3:-2])  # whole lines only, up to 4 KiB of them
    assert 300 < len(logged[3:-2]) < 4096 // 12


def test_an_unfinished_last_line_is_logged_when_the_process_ends(tmp_path: Path) -> None:
    path = tmp_path / "b.stderr.log"
    sink = StderrLog("b", [], path)
    sink.feed(b"starting\nfatal: cannot open the model")
    assert lines_of(path) == ["starting"]
    sink.feed(b"")
    assert lines_of(path) == ["starting", "fatal: cannot open the model"]


def test_a_connector_flooding_stderr_is_read_answers_and_leaves_a_bounded_log(
        echo_root: Path, run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            with caplog.at_level(logging.INFO, logger="handler.connector"):
                flooded = await client.call("echo_misbehave", {"mode": "flood"})
                assert flooded["structuredContent"] == {"text": "flooded"}  # never blocked on a full pipe
                said = await client.call("echo_say", {"text": "still here"})
                assert said["structuredContent"] == {"text": "still here"}
            await client.close()
            log = router.state_dir / "connectors/echo-local.stderr.log"
            written = log.stat().st_size + sum(p.stat().st_size for p in log.parent.glob("echo-local.stderr.log.*"))
            assert written < stderrlog.BURST_BYTES + FLOOD_BYTES // 4  # the flood itself is 16 MiB
            assert "dropped until it slows down" in log.read_text()
            flood = [r for r in caplog.records if "flood" in r.getMessage()]
            assert 0 < len(flood) < (stderrlog.BURST_BYTES + FLOOD_BYTES // 4) // 256
        # Stopped with the router: the last line it wrote, dropped in the flood, is kept.
        assert log.read_text().splitlines()[-1] == "flood done"

    run(scenario())
