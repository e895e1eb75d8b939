"""The config room's errors, under the project's root `HandlerError` (defined in `reconciler.wire.errors`).

Every room raises from here so callers catch by what happens next: a `ConfigError` means a person
fixes a file; a `SourceError` means the tree could not be read at all (a bad path or git ref).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from reconciler.wire.errors import HandlerError

if TYPE_CHECKING:
    from reconciler.config.findings import Finding

__all__ = ["ConfigError", "HandlerError", "SourceError"]


class SourceError(HandlerError):
    """The config tree could not be read: the folder, repository or ref is unusable."""


class ConfigError(HandlerError):
    """The config tree was read but holds errors a person must fix; carries every finding."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = tuple(findings)
        errors = sum(1 for f in self.findings if f.is_error)
        super().__init__(f"the config tree has {errors} error(s); run `handler validate` to see them")
