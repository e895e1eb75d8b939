"""The pool: one process per binding, its environment built from settings and secrets, restarted by content."""

from __future__ import annotations

import shutil
from pathlib import Path

from fixtures.echo_tree import TOKEN_ENV
from fixtures.harness import load, run

from reconciler.connectors.pool import ConnectorPool


def test_one_process_per_binding_with_settings_and_secrets_in_its_env(echo_root: Path, echo_secret: str) -> None:
    async def scenario() -> None:
        pool = ConnectorPool(echo_root, echo_root / ".handler")
        try:
            snapshot = load(echo_root)
            first = await pool.connector_for(snapshot, "echo-local")
            assert await pool.connector_for(snapshot, "echo-local") is first
            env = first.spec.env
            assert env["ECHO_TOKEN"] == echo_secret
            assert env["ECHO_GREETING"] == "hi"
            assert TOKEN_ENV not in env  # the router's own variables stay the router's
            assert echo_secret not in repr(first.spec)
        finally:
            await pool.close()

    run(scenario())


def test_a_changed_binding_gets_a_new_process(echo_root: Path, tmp_path: Path) -> None:
    changed = tmp_path / "t2"
    shutil.copytree(echo_root, changed)
    binding = changed / "config/bindings/echo-local.toml"
    binding.write_text(binding.read_text().replace('greeting = "hi"', 'greeting = "bonjour"'))

    async def scenario() -> None:
        pool = ConnectorPool(echo_root)
        try:
            old = await pool.connector_for(load(echo_root), "echo-local")
            new = await pool.connector_for(load(changed), "echo-local")
            assert old is not new
            assert new.spec.env["ECHO_GREETING"] == "bonjour"
            assert old.running  # sessions pinned to the old snapshot keep theirs
        finally:
            await pool.close()

    run(scenario())
