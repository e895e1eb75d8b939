"""The connector processes of a router: one per binding, started on its first call, stopped at shutdown.

A process is keyed by the binding's name and the content of the binding and its connector, so a
reload that changes either gives new sessions a new process while sessions pinned to the old
snapshot keep theirs. Draining and stopping idle processes is the connectors issue's to add.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from reconciler.config.snapshot import Snapshot
from reconciler.connectors.client import DEFAULT_MAX_LINE_BYTES, LaunchSpec, StdioConnector
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.secrets import resolve_secret

__all__ = ["BASE_ENV", "ConnectorPool", "PoolKey", "pool_key"]

# What a connector inherits from the router's environment; the rest (and every secret) is explicit.
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SYSTEMROOT")

PoolKey = tuple[str, str, str]  # (binding, binding content hash, connector content hash)


def pool_key(snapshot: Snapshot, binding_name: str) -> PoolKey | None:
    """What identifies a binding's process in `snapshot`: its name and the content it runs with."""
    binding = snapshot.bindings.get(binding_name)
    connector = snapshot.connectors.get(binding.connector or "") if binding is not None else None
    if binding is None or connector is None:
        return None
    return (binding_name, binding.content_hash, connector.content_hash)


class ConnectorPool:
    """Finds or starts the process of a binding as a snapshot describes it."""

    def __init__(self, root: Path, state_dir: Path | None = None,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._root = root
        self._logs = state_dir / "connectors" if state_dir is not None else None
        self._max_line_bytes = max_line_bytes
        self._live: dict[PoolKey, StdioConnector] = {}
        self._lock = asyncio.Lock()

    def running(self, key: PoolKey | None) -> StdioConnector | None:
        """The process of `key` (see `pool_key`) if it runs now: the per-call fast path, with no await."""
        found = self._live.get(key) if key is not None else None
        return found if found is not None and found.running else None

    async def connector_for(self, snapshot: Snapshot, binding_name: str) -> StdioConnector:
        """The running (or just started) process for `binding_name` as `snapshot` configures it."""
        binding = snapshot.bindings.get(binding_name)
        if binding is None or binding.connector is None:
            raise ConnectorStartError(f"binding '{binding_name}' is not a connector binding in this revision")
        connector = snapshot.connectors.get(binding.connector)
        if connector is None:
            raise ConnectorStartError(f"binding '{binding_name}' names connector '{binding.connector}', which is gone")
        key = (binding_name, binding.content_hash, connector.content_hash)
        found = self._live.get(key)
        if found is not None and found.running:
            return found
        async with self._lock:
            found = self._live.get(key)
            if found is None:
                found = StdioConnector(await self._launch_spec(snapshot, binding_name))
                self._live[key] = found
        await found.ensure_started()
        return found

    async def _launch_spec(self, snapshot: Snapshot, binding_name: str) -> LaunchSpec:
        binding = snapshot.bindings[binding_name]
        connector = snapshot.connectors[binding.connector or ""]
        run = connector.spec.run
        if run.builtin is not None:
            raise ConnectorStartError(f"connector '{connector.name}' is the built-in '{run.builtin}', which this "
                                      "router does not provide yet")
        if run.transport != "stdio" or not run.command:
            raise ConnectorStartError(f"connector '{connector.name}' runs over '{run.transport}'; this router "
                                      "starts stdio connectors only")
        env = {name: os.environ[name] for name in BASE_ENV if name in os.environ}
        for name, spec in connector.spec.settings.items():
            value = binding.spec.settings.get(name, spec.default)
            if value is not None:
                env[spec.env] = _setting_text(value)
        for slot, ref in binding.spec.secrets.items():
            slot_spec = connector.spec.secretSlots.get(slot)
            if slot_spec is not None:
                env[slot_spec.env] = await resolve_secret(slot, ref, self._root)
        stderr_path = None
        if self._logs is not None:
            self._logs.mkdir(parents=True, exist_ok=True, mode=0o700)
            stderr_path = str(self._logs / f"{binding_name}.stderr.log")
        return LaunchSpec(name=binding_name, command=tuple(run.command), cwd=str(self._root / connector.folder),
                          env=env, stderr_path=stderr_path, max_line_bytes=self._max_line_bytes)

    async def close(self) -> None:
        """Stop every process this pool started."""
        live, self._live = self._live, {}
        await asyncio.gather(*(c.stop() for c in live.values()), return_exceptions=True)


def _setting_text(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
