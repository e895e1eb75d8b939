"""The conformance runner's errors, under the project's root `HandlerError`."""

from __future__ import annotations

from reconciler.config import HandlerError

__all__ = ["CheckError", "ListingError"]


class CheckError(HandlerError):
    """A check cannot run as asked: an unknown connector or binding, or a tree whose files hold errors."""


class ListingError(HandlerError):
    """The catalog listing cannot be built or read: a result file or the listing is malformed."""
