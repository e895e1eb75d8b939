"""tts/v1's side of a speech engine run as a program: running it within the interface's time, the output a WAV
it wrote is described by, and the tool's handler. Which program, and what its failures mean, stay in its connector."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import wave
from pathlib import Path
from typing import Any, Protocol

import anyio

from handler_kit import Handler, InterfaceError, Reply

__all__ = ["Synthesizer", "describe_wav", "run_engine", "tts_synthesize"]

log = logging.getLogger("handler_kit.tts")


class Synthesizer(Protocol):
    async def synthesize(self, text: str, output: Path, voice: str | None) -> dict[str, Any]:
        """Speak `text` into a WAV at `output`; tts/v1's output (`describe_wav`'s)."""


def describe_wav(path: Path, engine: str) -> dict[str, Any]:
    """tts/v1's output for the WAV at `path`; a missing or unreadable file is `engine` failing."""
    try:
        size = path.stat().st_size
        with wave.open(str(path), "rb") as audio:
            frames, rate = audio.getnframes(), audio.getframerate()
    except (OSError, EOFError, wave.Error):
        log.exception("%s left no readable WAV", engine)
        raise InterfaceError("unavailable", "the speech engine wrote no usable audio for this text, and it does "
                             "the same each time: rephrase or shorten the text, or choose another voice",
                             retry="never") from None
    duration = round(frames / rate, 3) if rate > 0 else 0.0
    return {"path": str(path), "durationSeconds": duration, "bytes": size}


def tts_synthesize(engine: Synthesizer) -> Handler:
    """The `tts_synthesize` tool on `engine`."""

    async def handle(args: dict[str, Any]) -> Reply:
        result = await engine.synthesize(args["text"], Path(args["outputPath"]), args.get("voice"))
        return Reply(result, f"saved {result['durationSeconds']} seconds of speech ({result['bytes']} bytes)")

    return handle


TIMEOUT_SECONDS = 50.0  # under tts/v1's 60 s, so the agent hears why rather than a timeout
MAX_STDERR = 64 * 1024


async def run_engine(command: list[str], data: bytes) -> tuple[int, bytes]:
    """Run a speech engine's `command` with `data` on its stdin; (exit status, the first bytes of its stderr)."""
    stderr = b""
    with anyio.move_on_after(TIMEOUT_SECONDS) as scope:
        async with await anyio.open_process(command, stdout=subprocess.DEVNULL) as process:
            if process.stdin is None or process.stderr is None:  # never: both are pipes by default
                raise InterfaceError("unavailable", "the speech engine could not be started")
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # it stopped reading:
                await process.stdin.send(data)  # its status and stderr say why
                await process.stdin.aclose()
            async for chunk in process.stderr:
                if len(stderr) < MAX_STDERR:
                    stderr += chunk[: MAX_STDERR - len(stderr)]
            code = await process.wait()
    if scope.cancelled_caught:
        raise InterfaceError("unavailable", "the speech engine took too long on this text; try a shorter text")
    return code, stderr
