"""Who holds a state folder's service lock, and what its control socket answers."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from reconciler.liveness import ControlServer, Holder, ask_service, holder_of


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
