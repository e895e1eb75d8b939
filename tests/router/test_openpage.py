"""The page a bridge hands the router with the agent's stdio: the calls in flight, read once the router is gone."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from reconciler.router.openpage import PAGE_BYTES, OpenCalls, clear_page, make_page, page_problem, read_open


def test_the_bridge_reads_the_calls_the_router_left_open_in_the_order_they_began() -> None:
    page = make_page()
    calls = OpenCalls(page)
    for call_id in (1, "two", 3):
        calls.opened(call_id)
    calls.closed(1)  # answered: the bridge must never answer it again
    calls.closed("never opened")
    assert read_open(page) == ["two", 3]
    calls.close()  # the router gone: what it wrote last is what the bridge reads
    assert read_open(page) == ["two", 3]
    clear_page(page)
    assert read_open(page) == []
    os.close(page)


def test_a_router_killed_while_writing_leaves_the_previous_whole_list() -> None:
    page = make_page()
    calls = OpenCalls(page)
    calls.opened(7)
    # What a router killed after writing the new list but before its header leaves: the other half changed only.
    in_use = int.from_bytes(os.pread(page, 4, 0), "little")
    os.pwrite(page, b'["half-written', 8 + (1 - in_use) * ((PAGE_BYTES - 8) // 2))
    assert read_open(page) == [7]
    calls.close()
    os.close(page)


def test_ids_past_what_a_half_holds_are_not_known_rather_than_cut() -> None:
    page = make_page()
    calls = OpenCalls(page)
    calls.opened("x" * PAGE_BYTES)  # one id longer than the page: the bridge cannot answer it, and says so
    assert read_open(page) is None
    calls.close()
    os.close(page)


def test_a_page_that_could_shrink_under_the_router_is_refused(tmp_path: Path) -> None:
    unsealed = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
    os.ftruncate(unsealed, PAGE_BYTES)
    problem = page_problem(unsealed)
    assert problem is not None  # its owner could truncate it under the router's mapping: SIGBUS
    assert "sealed against shrinking" in problem
    fcntl.fcntl(unsealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    assert page_problem(unsealed) is None
    small = make_page()
    assert page_problem(small) is None
    file = tmp_path / "page"
    file.write_bytes(bytes(PAGE_BYTES))
    regular = os.open(file, os.O_RDWR)
    assert page_problem(regular) is not None  # a file cannot be sealed: refused whatever its size
    read_only = os.open(f"/proc/self/fd/{small}", os.O_RDONLY)
    assert page_problem(read_only) is not None
    for fd in (unsealed, small, regular, read_only):
        os.close(fd)
