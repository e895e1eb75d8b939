"""The MCP protocol surface in both eras: the per-connection era, negotiation, and the shapes of results.

The versions themselves are the wire's (`reconciler.wire.versions`). The initialize era negotiates
a version once in `initialize`. The stateless era (`2026-07-28`) has no handshake: every request
carries its version and the client's capabilities in `_meta`, `server/discover` tells what the
server speaks, every result carries `resultType`, list results carry `ttlMs`/`cacheScope`, and a
version the router does not speak gets `-32022` with the supported list. As in the reference SDK
server, a connection's first accepted request settles its era; a request of the other era on it is
refused (see `docs/router.md`).

Besides tools, a session serves its interface's skill (docs/router.md "Skills"): as a resource
(`resources/list`, `resources/read`) and as a prompt (`prompts/list`, `prompts/get`), for hosts that
surface one or the other; the results are shaped here, for both eras.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
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
    "ServedSkill",
    "discover_result",
    "get_prompt_result",
    "initialize_result",
    "list_prompts_result",
    "list_resources_result",
    "list_templates_result",
    "negotiate_handshake",
    "read_envelope",
    "read_resource_result",
]

SERVER_INFO: Final = {"name": "handler", "title": "Handler services router", "version": "0.1.0"}
# What a session lists never changes while it lasts (it is pinned to one generation), so nothing is announced.
CAPABILITIES: Final = {"tools": {"listChanged": False}, "resources": {"subscribe": False, "listChanged": False},
                       "prompts": {"listChanged": False}}
SKILL_MIME: Final = "text/markdown"
# A session is pinned to one snapshot, so what it lists never changes while it lasts; the hint
# only bounds how long a client may reuse a list across its own reconnections.
LIST_TTL_MS: Final = 60_000
CACHE_SCOPE: Final = "private"  # a listing is per profile: never share it across callers


@dataclass(frozen=True, slots=True)
class ServedSkill:
    """An interface version's skill as a session serves it: a resource at `uri`, a prompt named `name`."""

    key: str  # ocr/v1
    uri: str  # handler://skills/ocr/v1
    name: str  # ocr-v1: the prompt's name, and the folder a host loads it from (`handler mcp-config --skills`)
    description: str  # its front matter's
    text: str  # the whole SKILL.md


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


def _listing(result: dict[str, Any], stateless: bool) -> dict[str, Any]:
    """A list (or read) result, with the 2026-07-28 caching fields in that era."""
    if stateless:
        result.update(resultType="complete", ttlMs=LIST_TTL_MS, cacheScope=CACHE_SCOPE)
    return result


def list_resources_result(skills: tuple[ServedSkill, ...], stateless: bool) -> dict[str, Any]:
    """`resources/list`: each skill the session serves, at its stable address."""
    return _listing({"resources": [{"uri": s.uri, "name": s.name, "title": f"The {s.key} skill",
                                    "description": s.description, "mimeType": SKILL_MIME,
                                    "size": len(s.text.encode())} for s in skills]}, stateless)


def list_templates_result(stateless: bool) -> dict[str, Any]:
    """`resources/templates/list`, which hosts that browse resources ask: none, as no skill is templated."""
    return _listing({"resourceTemplates": []}, stateless)


def read_resource_result(skills: tuple[ServedSkill, ...], params: Mapping[str, Any] | None,
                         stateless: bool) -> dict[str, Any]:
    """`resources/read` of a skill's address; an unknown one is invalid params, naming those served."""
    uri = (params or {}).get("uri")
    if not isinstance(uri, str):
        raise JsonRpcError(INVALID_PARAMS, "resources/read needs params.uri, a string such as 'handler://skills/ocr/v1'")
    skill = next((s for s in skills if s.uri == uri), None)
    if skill is None:
        served = ", ".join(s.uri for s in skills) or "none"
        raise JsonRpcError(INVALID_PARAMS, f"no resource '{uri[:200]}' here; this session serves: {served}",
                           {"uri": uri[:200]})
    return _listing({"contents": [{"uri": skill.uri, "mimeType": SKILL_MIME, "text": skill.text}]}, stateless)


def list_prompts_result(skills: tuple[ServedSkill, ...], stateless: bool) -> dict[str, Any]:
    """`prompts/list`: each skill as a prompt without arguments, for hosts that surface prompts, not resources."""
    return _listing({"prompts": [{"name": s.name, "title": f"The {s.key} skill", "description": s.description}
                                 for s in skills]}, stateless)


def get_prompt_result(skills: tuple[ServedSkill, ...], params: Mapping[str, Any] | None,
                      stateless: bool) -> dict[str, Any]:
    """`prompts/get`: the whole skill as one user message; an unknown name is invalid params, naming those served."""
    name = (params or {}).get("name")
    skill = next((s for s in skills if s.name == name), None)
    if skill is None:
        served = ", ".join(s.name for s in skills) or "none"
        raise JsonRpcError(INVALID_PARAMS, f"no prompt {str(name)[:200]!r} here; this session serves: {served}")
    result: dict[str, Any] = {"description": skill.description,
                              "messages": [{"role": "user", "content": {"type": "text", "text": skill.text}}]}
    if stateless:
        result["resultType"] = "complete"
    return result
