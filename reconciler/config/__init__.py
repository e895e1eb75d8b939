"""The ground floor: the config tree's data model, loading, save-time checks and plans."""

from reconciler.config.cases import Assertion, Case
from reconciler.config.checks import check_frozen
from reconciler.config.errors import ConfigError, HandlerError, SourceError
from reconciler.config.findings import CODES, Finding, Severity, did_you_mean
from reconciler.config.loading import Loader, load_snapshot
from reconciler.config.models import ActionClass, Outcome
from reconciler.config.planning import Plan, describe_profile, plan_changes
from reconciler.config.snapshot import (
    Binding,
    Connector,
    InterfaceVersion,
    Profile,
    Selection,
    Snapshot,
    effective_limits,
)
from reconciler.config.sources import FolderSource, GitSource, TreeSource, short_revision

__all__ = [
    "CODES",
    "ActionClass",
    "Assertion",
    "Binding",
    "Case",
    "ConfigError",
    "Connector",
    "Finding",
    "FolderSource",
    "GitSource",
    "HandlerError",
    "InterfaceVersion",
    "Loader",
    "Outcome",
    "Plan",
    "Profile",
    "Selection",
    "Severity",
    "Snapshot",
    "SourceError",
    "TreeSource",
    "check_frozen",
    "describe_profile",
    "did_you_mean",
    "effective_limits",
    "load_snapshot",
    "plan_changes",
    "short_revision",
]
