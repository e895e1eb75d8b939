"""Resolving a binding's secret references to their values, at the moment a connector starts.

A binding never holds a secret, only where to find it (docs/architecture.md §4): an environment variable of the
router, a file, or a command whose standard output is the secret. Values live only in the
connector's environment; they are never logged, and errors name the reference, never a value.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from reconciler.config.models import SecretRef
from reconciler.connectors.errors import ConnectorNotSetUpError, ConnectorStartError

__all__ = ["resolve_secret"]

COMMAND_TIMEOUT_SECONDS = 15.0


async def resolve_secret(slot: str, ref: SecretRef | str, root: Path) -> str:
    """The value `ref` points at; raises `ConnectorNotSetUpError` naming the slot and the reference when it finds
    nothing there (a person must set it up), `ConnectorStartError` when its command failed this time."""
    if isinstance(ref, str):
        # The checks refuse literal secrets (B003), so a snapshot that reaches here never has one.
        raise ConnectorNotSetUpError(f"secret slot '{slot}' holds a literal value; give an env, file or command "
                                     "reference")
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if value is None:
            raise ConnectorNotSetUpError(f"secret slot '{slot}': the router's environment has no {ref.env}")
        return value
    if ref.file is not None:
        path = Path(ref.file).expanduser()
        path = path if path.is_absolute() else root / path
        try:
            return path.read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConnectorNotSetUpError(f"secret slot '{slot}': cannot read {path}: {exc.strerror}") from None
    if not ref.command:  # pragma: no cover - the model admits exactly one of env, file, command
        raise ConnectorNotSetUpError(f"secret slot '{slot}' names no env, file or command")
    return await _run_secret_command(slot, ref.command, root)


async def _run_secret_command(slot: str, command: list[str], root: Path) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=root, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    except OSError as exc:
        raise ConnectorNotSetUpError(f"secret slot '{slot}': cannot run {command[0]}: {exc.strerror}") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_SECONDS)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ConnectorStartError(
            f"secret slot '{slot}': {command[0]} gave no answer in {COMMAND_TIMEOUT_SECONDS:.0f} s") from None
    if proc.returncode != 0:
        raise ConnectorStartError(f"secret slot '{slot}': {command[0]} exited with code {proc.returncode}")
    return out.decode().rstrip("\r\n")
