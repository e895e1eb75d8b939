"""The MCP protocol versions the project speaks, and the `_meta` keys of the 2026-07-28 envelope.

The initialize era (`2024-11-05` … `2025-11-25`) negotiates a version once; the stateless era
(`2026-07-28`) carries it in every request's `_meta` (docs/architecture.md §6). `LATEST_HANDSHAKE`
is what the project's own clients offer — to the router, and the router to a connector.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "HANDSHAKE_VERSIONS",
    "LATEST_HANDSHAKE",
    "META_CLIENT_CAPABILITIES",
    "META_CLIENT_INFO",
    "META_PROTOCOL_VERSION",
    "META_SERVER_INFO",
    "MODERN_VERSIONS",
    "SUPPORTED_VERSIONS",
]

HANDSHAKE_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS: Final = ("2026-07-28",)
LATEST_HANDSHAKE: Final = HANDSHAKE_VERSIONS[-1]
# Newest first, as the specification's own example lists them in -32022 data.
SUPPORTED_VERSIONS: Final = (*reversed(MODERN_VERSIONS), *reversed(HANDSHAKE_VERSIONS))

META_PROTOCOL_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"
