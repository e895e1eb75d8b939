"""Who holds a state folder's service lock, and what its control socket answers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.liveness import ControlServer, Holder, ask_service, holder_of
from tests.fixtures.harness import short_dir

HANDLER = str(Path(sys.executable).parent / "handler")


def test_no_service_holds_a_state_folder_that_is_not_there(tmp_path: Path) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    assert holder_of(tmp_path / "missing") is None
    assert holder_of(file) is None  # raised NotADirectoryError, a traceback in 'handler dashboard login'


def test_the_control_socket_answers_status_as_it_is_and_doctor_after_checking_again(tmp_path: Path) -> None:
    """`{"ask": "status"}` reads the status; `{"ask": "doctor"}` (what `handler doctor` sends) runs the check first,
    in the service, and answers the status it leaves; anything else is told what to ask."""
    checks = []

    def status() -> dict[str, Any]:
        return {"checks": len(checks)}

    async def recheck() -> dict[str, Any]:
        checks.append(1)
        return status()

    async def scenario() -> None:
        server = ControlServer(tmp_path / "service.sock", status, recheck)
        await server.start()
        try:
            holder = Holder(os.getpid(), "now", str(tmp_path), str(tmp_path / "service.sock"))
            assert await asyncio.to_thread(ask_service, holder) == {"checks": 0}
            assert await asyncio.to_thread(ask_service, holder, 5.0, "doctor") == {"checks": 1}
            assert await asyncio.to_thread(ask_service, holder) == {"checks": 1}
            assert await asyncio.to_thread(ask_service, holder, 5.0, "restart") is None  # told what to ask
        finally:
            await server.aclose()
    asyncio.run(scenario())


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's state folder needs a second user: root drops to nobody")
@pytest.mark.parametrize("command", [["status"], ["agent", "list"], ["doctor"]])
def test_a_command_on_another_users_state_folder_says_whose_it_is_not_and_what_to_do(command: list[str]) -> None:
    """Run as nobody on root's state folder (0700, a service's lock in it) in a root nobody may read: one line that
    says so, exit 1, no traceback."""
    with short_dir() as root:  # under /tmp itself: pytest's own folders are root's alone
        root.chmod(0o755)
        state = root / ".handler"
        state.mkdir(mode=0o700)
        (state / "service.lock").write_text("{}")
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", HANDLER, *command,
                               "--root", str(root)], capture_output=True, text=True, check=False, timeout=60, cwd="/",
                              env={"PATH": os.environ["PATH"]})
    assert done.returncode == 1, done.stderr
    assert done.stderr == (f"handler: {state} is not this user's to read (Permission denied): run this as the user the "
                           "service runs as, or name a folder of your own (--state-dir, HANDLER_STATE_DIR)\n")
