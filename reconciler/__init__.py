"""Handler services: the control plane that binds agents' capability contracts to providers.

The public face is small; everything not named here is internal and may change.
"""

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
