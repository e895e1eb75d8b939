"""The governance room's errors, under the project's root `HandlerError`.

Grouped by what the caller does next: `UnknownCallError` and `HoldNotFoundError` mean the name given is wrong
(with a "did you mean"); `NotAllowedError` means this person or instance may not decide that hold;
`StoreError` means the store could not be reached or migrated (a database URL or file to fix);
`StoreRefusedError`, that it is up but refused what was written (a value it cannot hold: a defect upstream);
`CredentialError`, that a request to an MCP endpoint over HTTP carried no credential of its profile (the HTTP answer
it gets is in the error); `TokenError`, that a token cannot be made or revoked as asked.
"""

from __future__ import annotations

from reconciler.config.errors import HandlerError

__all__ = ["CredentialError", "GovernanceError", "HoldNotFoundError", "NotAllowedError", "StoreError",
           "StoreRefusedError", "TokenError", "UnknownCallError"]


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


class TokenError(GovernanceError):
    """A token cannot be made or revoked as asked (a name taken or unknown, an expiry that does not read)."""


class CredentialError(GovernanceError):
    """A request carried no credential of the profile it asked for: the HTTP answer it gets.

    `status` is 401 (no credential, or one that is not valid for this profile) or 503 (the issuer's keys cannot be
    fetched now); `str(error)` is the body, saying what was wrong and how to get a credential; `www_authenticate` is
    the `WWW-Authenticate` header's value (RFC 6750 §3, with RFC 9728's `resource_metadata` when the org names an
    issuer)."""

    def __init__(self, message: str, *, status: int, www_authenticate: str) -> None:
        super().__init__(message)
        self.status = status
        self.www_authenticate = www_authenticate

    @property
    def headers(self) -> dict[str, str]:
        """The headers the refusal goes with."""
        return {"WWW-Authenticate": self.www_authenticate, "Cache-Control": "no-store"}
