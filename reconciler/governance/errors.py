"""The governance room's errors, under the project's root `HandlerError`.

Grouped by what the caller does next: `UnknownCallError` and `HoldNotFoundError` mean the name given is wrong
(with a "did you mean"); `NotAllowedError` means this person or instance may not decide that hold;
`StoreError` means the store could not be reached or migrated (a database URL or file to fix).
"""

from __future__ import annotations

from reconciler.config.errors import HandlerError

__all__ = ["GovernanceError", "HoldNotFoundError", "NotAllowedError", "StoreError", "UnknownCallError"]


class GovernanceError(HandlerError):
    """Something governance was asked cannot be done."""


class UnknownCallError(GovernanceError):
    """The profile or tool named does not exist in the config tree."""


class HoldNotFoundError(GovernanceError):
    """No hold has that request id."""


class NotAllowedError(GovernanceError):
    """The person or instance asking may not decide this hold."""


class StoreError(GovernanceError):
    """The store could not be opened, reached or migrated."""
