"""Handler services: the control plane that binds agents' capability contracts to providers.

The public face is small; everything not named here is internal and may change. The names load
on first use, so that the stdio bridge (`handler-service`, a `reconciler.router` module an agent
starts for every interface) does not pay for loading the config room when it starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reconciler.config import (
        ConfigError,
        Finding,
        HandlerError,
        Loader,
        Plan,
        Snapshot,
        SourceError,
        check_frozen,
        load_snapshot,
        plan_changes,
    )

__all__ = [
    "ConfigError",
    "Finding",
    "HandlerError",
    "Loader",
    "Plan",
    "Snapshot",
    "SourceError",
    "check_frozen",
    "load_snapshot",
    "plan_changes",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("reconciler.config"), name)
    raise AttributeError(f"module 'reconciler' has no attribute {name!r}")
