"""The governance room's errors, under the project's root `HandlerError`.

Grouped by what the caller does next: `UnknownCallError` and `HoldNotFoundError` mean the name given is wrong
(with a "did you mean"); `NotAllowedError` means this person or instance may not decide that hold;
`StoreError` means the store could not be reached or migrated (a database URL or file to fix);
`StoreRefusedError`, that it is up but refused what was written (a value it cannot hold: a defect upstream).
"""

from __future__ import annotations

from reconciler.config.errors import HandlerError

__all__ = ["GovernanceError", "HoldNotFoundError", "NotAllowedError", "StoreError", "StoreRefusedError",
           "UnknownCallError"]


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


class StoreRefusedError(StoreError):
    """The store is up but refused the data of a write (too long, out of range, a constraint): trying the same
    write again fails again, so whoever holds it sets it aside rather than retrying it (docs/architecture.md §7)."""
