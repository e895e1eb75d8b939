"""The MCP protocol surface in both eras: the per-connection era, negotiation, and the shapes of results.

The versions themselves are the wire's (`reconciler.wire.versions`). The initialize era negotiates
a version once in `initialize`. The stateless era (`2026-07-28`) has no handshake: every request
carries its version and the client's capabilities in `_meta`, `server/discover` tells what the
server speaks, every result carries `resultType`, list results carry `ttlMs`/`cacheScope`, and a
version the router does not speak gets `-32022` with the supported list. As in the reference SDK
server, a connection's first accepted request settles its era; a request of the other era on it is
refused (see `docs/router.md`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

from reconciler.wire.errors import INVALID_PARAMS, INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION, JsonRpcError
from reconciler.wire.versions import (
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE,
    META_CLIENT_CAPABILITIES,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    MODERN_VERSIONS,
    SUPPORTED_VERSIONS,
)

__all__ = [
    "LIST_TTL_MS",
    "SERVER_INFO",
    "Era",
    "discover_result",
    "initialize_result",
    "negotiate_handshake",
    "read_envelope",
]

SERVER_INFO: Final = {"name": "handler", "title": "Handler services router", "version": "0.1.0"}
CAPABILITIES: Final = {"tools": {"listChanged": False}}
# A session is pinned to one snapshot, so what it lists never changes while it lasts; the hint
# only bounds how long a client may reuse a list across its own reconnections.
LIST_TTL_MS: Final = 60_000
CACHE_SCOPE: Final = "private"  # a listing is per profile: never share it across callers


class Era(enum.Enum):
    HANDSHAKE = "initialize"
    STATELESS = "stateless"


def has_envelope(params: Mapping[str, Any] | None) -> bool:
    """True when the request carries the 2026-07-28 per-request envelope (its version key)."""
    if not params:
        return False
    meta = params.get("_meta")
    return isinstance(meta, dict) and META_PROTOCOL_VERSION in meta


def read_envelope(params: Mapping[str, Any] | None) -> str:
    """The protocol version of a stateless-era request, or the JSON-RPC error that refuses it."""
    meta = (params or {}).get("_meta")
    if not isinstance(meta, dict):
        raise JsonRpcError(INVALID_PARAMS, f"params._meta must be an object carrying the required "
                           f"'{META_PROTOCOL_VERSION}' and '{META_CLIENT_CAPABILITIES}' envelope keys")
    missing = [k for k in (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES) if k not in meta]
    if missing:
        raise JsonRpcError(INVALID_PARAMS,
                           f"params._meta is missing the required envelope key(s): {', '.join(missing)}")
    version = meta[META_PROTOCOL_VERSION]
    if not isinstance(version, str):
        raise JsonRpcError(INVALID_PARAMS, "the protocol-version envelope value must be a string")
    if version not in MODERN_VERSIONS:
        raise unsupported_version(version, SUPPORTED_VERSIONS)
    return version


def unsupported_version(requested: str, supported: tuple[str, ...]) -> JsonRpcError:
    return JsonRpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
                        {"supported": list(supported), "requested": requested})


def refuse_other_era(era: Era, method: str, params: Mapping[str, Any] | None) -> JsonRpcError:
    """The error for a request of the era this connection did not settle on."""
    if era is Era.STATELESS:
        requested = (params or {}).get("protocolVersion")
        data: dict[str, Any] = {"supported": list(MODERN_VERSIONS)}
        if isinstance(requested, str):
            data["requested"] = requested
        return JsonRpcError(UNSUPPORTED_PROTOCOL_VERSION, "this connection serves the 2026-07-28 protocol; the "
                            "initialize handshake is not accepted on it", data)
    return JsonRpcError(INVALID_REQUEST, f"this connection serves the initialize protocol era; '{method}' with the "
                        "2026-07-28 envelope is not accepted on it (open a new connection for that era)")


def negotiate_handshake(params: Mapping[str, Any] | None) -> str:
    """The version to answer `initialize` with: the client's if the router speaks it, else its newest."""
    requested = (params or {}).get("protocolVersion")
    if not isinstance(requested, str):
        raise JsonRpcError(INVALID_PARAMS, "initialize needs params.protocolVersion, a string such as '2025-11-25'")
    return requested if requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE


def initialize_result(version: str, instructions: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"protocolVersion": version, "capabilities": CAPABILITIES, "serverInfo": SERVER_INFO}
    if instructions:
        result["instructions"] = instructions
    return result


def discover_result(instructions: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "supportedVersions": list(SUPPORTED_VERSIONS),
        "capabilities": CAPABILITIES,
        "resultType": "complete",
        "ttlMs": LIST_TTL_MS,
        "cacheScope": CACHE_SCOPE,
        "_meta": {META_SERVER_INFO: SERVER_INFO},
    }
    if instructions:
        result["instructions"] = instructions
    return result
