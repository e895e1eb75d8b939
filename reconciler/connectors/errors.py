"""The failures of a connector process, as the router's error mapping (docs/architecture.md §2 step 8) sees them.

Each carries a `cause`: the word the router puts in `_meta["handler/cause"]` and in the call log
when it turns the failure into the interface error `unavailable`. They are grouped by what happened,
not by where: the process could not start, it died or closed its pipe, or it answered with a
JSON-RPC error instead of a tool result.
"""

from __future__ import annotations

import copy

from reconciler.config.errors import HandlerError

__all__ = [
    "ConnectorCrashedError",
    "ConnectorError",
    "ConnectorNotSetUpError",
    "ConnectorOutputInvalidError",
    "ConnectorOutputTooLargeError",
    "ConnectorReplyError",
    "ConnectorRestartingError",
    "ConnectorStartError",
]


class ConnectorError(HandlerError):
    """A connector failed to produce a tool result; `cause` names how, for the log and `_meta`."""

    cause = "connector_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def reworded(self, message: str) -> ConnectorError:
        """The same failure, of the same type, told in `message` (a binding's name put before it)."""
        again = copy.copy(self)
        again.message = message
        again.args = (message,)
        return again


class ConnectorStartError(ConnectorError):
    """The process could not be started or did not complete the MCP handshake."""

    cause = "start_failed"


class ConnectorNotSetUpError(ConnectorStartError):
    """The binding cannot start on this machine until a person sets it up: a secret its reference does not find,
    a program, package or environment it needs that is not installed, no sandbox. Retrying cannot help; its
    owners are told once (docs/router.md "Retrying")."""

    cause = "not_set_up"


class ConnectorCrashedError(ConnectorError):
    """The process exited or closed its output while calls were in flight; every pending call fails."""

    cause = "crashed"


class ConnectorRestartingError(ConnectorCrashedError):
    """The process crashed and waits out its backoff before it starts again, longer than the call could wait."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds  # until it starts again


class ConnectorReplyError(ConnectorError):
    """The connector answered a call with a JSON-RPC error rather than a tool result."""

    cause = "connector_error"

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"the connector answered with JSON-RPC error {code}: {message}")
        self.code = code


class ConnectorOutputTooLargeError(ConnectorError):
    """The connector answered a call with a message over the line limit; the call fails, the process lives on."""

    cause = "output_too_large"


class ConnectorOutputInvalidError(ConnectorError):
    """The connector answered a call with a reply that does not parse; the call fails, the process lives on."""

    cause = "output_invalid"

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field  # what was wrong, for the call log (never the reply's content)
