"""Secret references resolve at start; errors name the slot and the reference, never a value."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reconciler.config.models import SecretRef
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.secrets import resolve_secret
from tests.fixtures.harness import run


def test_env_file_and_command_references(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HANDLER_TEST_SECRET", "from-env")
    (tmp_path / "key.txt").write_text("from-file\n")
    command = [sys.executable, "-c", "print('from-command')"]

    async def scenario() -> list[str]:
        return [await resolve_secret("a", SecretRef(env="HANDLER_TEST_SECRET"), tmp_path),
                await resolve_secret("b", SecretRef(file="key.txt"), tmp_path),
                await resolve_secret("c", SecretRef(command=command), tmp_path)]

    assert run(scenario()) == ["from-env", "from-file", "from-command"]


def test_an_unresolvable_reference_names_the_slot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HANDLER_TEST_ABSENT", raising=False)

    async def scenario() -> None:
        with pytest.raises(ConnectorStartError, match=r"slot 'api_key'.*HANDLER_TEST_ABSENT"):
            await resolve_secret("api_key", SecretRef(env="HANDLER_TEST_ABSENT"), tmp_path)
        with pytest.raises(ConnectorStartError, match="cannot read"):
            await resolve_secret("api_key", SecretRef(file="absent.txt"), tmp_path)
        with pytest.raises(ConnectorStartError, match="exited with code 3"):
            await resolve_secret("api_key", SecretRef(command=[sys.executable, "-c", "exit(3)"]), tmp_path)
        with pytest.raises(ConnectorStartError, match="literal"):
            await resolve_secret("api_key", "sk-literal", tmp_path)

    run(scenario())
