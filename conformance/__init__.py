"""The conformance runner: interface cases and schema fuzzing through the real router.

`handler connector check CONNECTOR --binding B` runs it (a pytest plugin underneath, registered
under `pytest11`); `handler catalog build` lists connectors from its results. What a program may
import is named here; every other module is internal.

The names load on first use: pytest imports `conformance.plugin` (and so this package) in every
session of the environment, which must not pay for the router and the config loader.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.cases import evaluate_case
    from conformance.check import check_connector
    from conformance.errors import CheckError, ListingError
    from conformance.failures import ConformanceFailure
    from conformance.listing import TIERS, build_listing, check_listing, record_run
    from conformance.replies import Reply
    from conformance.workspace import load_subject

__all__ = [
    "TIERS",
    "CheckError",
    "ConformanceFailure",
    "ListingError",
    "Reply",
    "build_listing",
    "check_connector",
    "check_listing",
    "evaluate_case",
    "load_subject",
    "record_run",
]

_HOME = {
    "TIERS": "listing", "CheckError": "errors", "ConformanceFailure": "failures", "ListingError": "errors",
    "Reply": "replies", "build_listing": "listing", "check_connector": "check", "check_listing": "listing",
    "evaluate_case": "cases", "load_subject": "workspace", "record_run": "listing",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'conformance' has no attribute '{name}'")
    return getattr(importlib.import_module(f"conformance.{_HOME[name]}"), name)
