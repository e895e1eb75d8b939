"""The ground floor of the wire: JSON-RPC over lines, as every room speaks it (docs/architecture.md §6).

It imports nothing else of the project. `framing` cuts streams into lines under a limit,
`messages` parses and encodes them, `errors` holds the exception root and `JsonRpcError`, `meta`
the project's `_meta` keys and the reported cost, `versions` the MCP protocol versions, and
`client` the one line client every client of ours is built on.
"""

from reconciler.wire.client import LineClient
from reconciler.wire.errors import HandlerError, JsonRpcError, LineClosedError
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES, OVERSIZE, LineFramer, Oversize
from reconciler.wire.messages import IdentifiedError, Message, parse_message
from reconciler.wire.meta import caller_meta, read_reported_cost

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "OVERSIZE",
    "HandlerError",
    "IdentifiedError",
    "JsonRpcError",
    "LineClient",
    "LineClosedError",
    "LineFramer",
    "Message",
    "Oversize",
    "caller_meta",
    "parse_message",
    "read_reported_cost",
]
