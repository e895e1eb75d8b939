"""Who holds a state folder's service lock."""

from __future__ import annotations

from pathlib import Path

from reconciler.liveness import holder_of


def test_no_service_holds_a_state_folder_that_is_not_there(tmp_path: Path) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    assert holder_of(tmp_path / "missing") is None
    assert holder_of(file) is None  # raised NotADirectoryError, a traceback in 'handler dashboard login'
