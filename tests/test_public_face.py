"""The control plane's public face: every name in `reconciler.__all__` resolves, loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import reconciler


def test_every_exported_name_exists() -> None:
    for name in reconciler.__all__:
        assert getattr(reconciler, name) is not None, name


def test_internal_names_are_not_offered() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Router'"):
        _ = reconciler.Router  # type: ignore[attr-defined]


def test_the_bridge_starts_without_loading_the_config_room() -> None:
    # An agent starts one handler-service per interface: its start-up must stay light.
    probe = "import sys, reconciler.router.bridge; print(sorted(m for m in sys.modules if m.startswith('reconciler')))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert "reconciler.config" not in done.stdout, done.stdout
