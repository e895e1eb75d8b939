"""The built-in `llm` connector: llm/v2's `llm_chat` (a turn with tools) and llm/v1's `llm_complete` (the same
turn without them) over a vendor's HTTP API, inside the router.

Two wire formats, chosen by the binding's `endpoint` setting: `openai-chat` (POST /v1/chat/completions,
also what most gateways speak) and `anthropic` (POST /v1/messages); the bodies and the reading of replies,
tool calls included, are `llmturns`'s. Vendor failures map onto the interfaces' closed lists: 429 → `limit`;
a content refusal → `refused`; 5xx, timeouts, unreachable hosts, bad JSON and unusable keys → `unavailable`;
tool calls whose arguments are not an object → `invalid_tool_call` (llm/v2), which may go through when asked
again. It answers like any connector (a `CallToolResult` dict), so the router's pipeline treats it the same,
validation of its output and the charge of its binding's price included.

It runs inside the router, not in a sandbox, so its binding's effective egress is applied here: a
`base_url` whose host:port the egress does not allow is `unavailable` at every call without a byte
sent (and B011 at `handler validate`), and every connection is dialled through
`dialing.EgressBackend`, which checks the addresses a name resolves to as the egress proxy does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from reconciler.config.reach import url_reach_problem
from reconciler.connectors.dialing import EgressRefusedError, egress_transport
from reconciler.connectors.llmturns import (
    LlmError,
    anthropic_body,
    check_turn,
    openai_body,
    read_anthropic,
    read_openai,
)
from reconciler.wire.meta import RETRY, RETRY_LATER

__all__ = ["LlmConnector", "LlmSettings", "tool_error"]

_DEFAULT_BASE = {"openai-chat": "https://api.openai.com", "anthropic": "https://api.anthropic.com"}
_ANTHROPIC_VERSION = "2023-06-01"
_ASK_AGAIN = frozenset({"invalid_tool_call"})  # the same call may go through: a model's slip, not the caller's


@dataclass(frozen=True)
class LlmSettings:
    endpoint: str  # "openai-chat" | "anthropic"
    model: str
    api_key: str
    base_url: str | None = None
    models: tuple[str, ...] = ()  # other models a call may name
    timeout: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], timeout: float = 120.0) -> LlmSettings:
        """From the variables the connector's manifest declares (LLM_ENDPOINT, LLM_MODEL, ...)."""
        endpoint = env.get("LLM_ENDPOINT", "")
        if endpoint not in _DEFAULT_BASE:
            raise ValueError(f"endpoint {endpoint!r} is not one of: {', '.join(_DEFAULT_BASE)}")
        models = tuple(m.strip() for m in env.get("LLM_MODELS", "").split(",") if m.strip())
        return cls(
            endpoint,
            env.get("LLM_MODEL", ""),
            env.get("LLM_API_KEY", ""),
            env.get("LLM_BASE_URL") or None,
            models,
            timeout,
        )


def tool_error(code: str, message: str) -> dict[str, Any]:
    """An interface error as a connector returns it."""
    body = {"error": code, "message": message}
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": orjson.dumps(body).decode()}],
        "structuredContent": body,
        "isError": True,
    }
    if code in _ASK_AGAIN:
        result["_meta"] = {RETRY: RETRY_LATER}
    return result


class LlmConnector:
    """One binding's model service; shares one HTTP connection pool between all calls."""

    def __init__(self, settings: LlmSettings, egress: Sequence[str], name: str = "llm") -> None:
        """`egress`: the binding's effective egress, the only destinations its calls may reach."""
        self.settings = settings
        self.name = name
        base = settings.base_url or _DEFAULT_BASE[settings.endpoint]
        problem = url_reach_problem(egress, base)
        self._out_of_reach = None if problem is None else (
            f"binding '{name}' cannot reach its provider: {base} — {problem}; set its base_url to a host its "
            "egress names, or add that host:port to the binding's egress (within its connector's)")
        self._http = httpx.AsyncClient(base_url=base.rstrip("/"), timeout=httpx.Timeout(settings.timeout),
                                       transport=egress_transport(egress, name), trust_env=False)

    @property
    def running(self) -> bool:
        return not self._http.is_closed

    async def ensure_started(self) -> None:
        """Nothing to start: the first call opens the connection."""

    async def stop(self) -> None:
        await self._http.aclose()

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        if name not in _TOOLS:
            return tool_error("unavailable", f"the llm connector has no tool '{name}'")
        if self._out_of_reach is not None:
            return tool_error("unavailable", self._out_of_reach)
        model = arguments.get("model") or self.settings.model
        if model != self.settings.model and model not in self.settings.models:
            allowed = ", ".join((self.settings.model, *self.settings.models))
            return tool_error("refused", f"model '{model}' is not offered by this service; it offers: {allowed}")
        try:
            output = await _TOOLS[name](self, model, arguments)
        except LlmError as failure:
            return tool_error(failure.code, failure.message)
        return {
            "content": [{"type": "text", "text": orjson.dumps(output).decode()}],
            "structuredContent": output,
            "isError": False,
        }

    async def chat(self, model: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """llm/v2's `llm_chat`: the turn checked, then sent in the binding's vendor's format."""
        check_turn(arguments)
        if self.settings.endpoint == "anthropic":
            headers = {"x-api-key": self.settings.api_key, "anthropic-version": _ANTHROPIC_VERSION}
            return read_anthropic(await self._post("/v1/messages", anthropic_body(model, arguments), headers))
        headers = {"authorization": f"Bearer {self.settings.api_key}"}
        return read_openai(await self._post("/v1/chat/completions", openai_body(model, arguments), headers))

    async def complete(self, model: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """llm/v1's `llm_complete`: the same turn with its `system` as the first message and no tools, its reply
        the text one without its `type`."""
        system = [{"role": "system", "content": arguments["system"]}] if arguments.get("system") else []
        turn = {key: arguments[key] for key in ("maxTokens", "temperature") if key in arguments}
        output = await self.chat(model, {**turn, "messages": [*system, *arguments["messages"]]})
        if output.pop("type") != "text":
            raise LlmError("unavailable", "the provider answered with tool calls, though none were offered")
        return output

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        try:
            reply = await self._http.post(
                path, content=orjson.dumps(body), headers={"content-type": "application/json", **headers}
            )
        except httpx.TimeoutException:
            raise LlmError(
                "unavailable", f"the provider did not answer within {self.settings.timeout:.0f} s"
            ) from None
        except httpx.HTTPError as exc:
            raise LlmError("unavailable", f"the provider could not be reached ({type(exc).__name__})") from None
        except EgressRefusedError as exc:
            raise LlmError("unavailable", str(exc)) from None
        try:
            data = orjson.loads(reply.content) if reply.content else {}
        except orjson.JSONDecodeError:
            raise LlmError(
                "unavailable", f"the provider answered HTTP {reply.status_code} with a body that is not JSON"
            ) from None
        if reply.status_code >= 400:
            raise _vendor_failure(reply.status_code, data)
        if not isinstance(data, dict):
            raise LlmError("unavailable", "the provider's answer is not a JSON object")
        return data


_TOOLS = {"llm_complete": LlmConnector.complete, "llm_chat": LlmConnector.chat}


def _vendor_failure(status: int, data: Any) -> LlmError:
    """A vendor's HTTP error, mapped onto llm/v1's errors with the vendor's own words kept short."""
    error = data.get("error") if isinstance(data, dict) else None
    detail = ""
    kinds: set[str] = set()
    if isinstance(error, dict):
        detail = str(error.get("message") or "")[:300]
        kinds = {str(error.get("type") or ""), str(error.get("code") or "")}
    if status == 429 or kinds & {"rate_limit_error", "rate_limit_exceeded", "insufficient_quota"}:
        return LlmError("limit", f"the provider's rate limit or quota was reached: {detail or 'HTTP 429'}")
    if kinds & {"content_policy_violation", "content_filter"}:
        return LlmError("refused", f"the provider refused the content: {detail}")
    if status in (401, 403):
        return LlmError(
            "unavailable",
            f"the provider refused the binding's key (HTTP {status}); the key may be wrong, revoked or lack access",
        )
    return LlmError("unavailable", f"the provider answered HTTP {status}" + (f": {detail}" if detail else ""))
