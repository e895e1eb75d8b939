"""The conformance runner's public face: every name in `conformance.__all__` resolves; others are not offered."""

from __future__ import annotations

import pytest

import conformance


def test_every_exported_name_exists() -> None:
    for name in conformance.__all__:
        assert getattr(conformance, name) is not None, name


def test_internal_names_are_not_offered() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Harness'"):
        _ = conformance.Harness
