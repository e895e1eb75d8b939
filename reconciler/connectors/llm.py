"""The built-in `llm` connector: llm/v1's `llm_complete` over a vendor's HTTP API, inside the router.

Two wire formats, chosen by the binding's `endpoint` setting: `openai-chat` (POST /v1/chat/completions,
also what most gateways speak) and `anthropic` (POST /v1/messages). Vendor failures map onto llm/v1's
closed list: 429 → `limit`; a content refusal → `refused`; 5xx, timeouts, unreachable hosts, bad JSON
and unusable keys → `unavailable`. It answers like any connector (a `CallToolResult` dict), so the
router's pipeline treats it the same, validation of its output included.

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

from reconciler.config.errors import HandlerError
from reconciler.config.reach import url_reach_problem
from reconciler.connectors.dialing import EgressRefusedError, egress_transport

__all__ = ["LlmConnector", "LlmSettings", "tool_error"]

_DEFAULT_BASE = {"openai-chat": "https://api.openai.com", "anthropic": "https://api.anthropic.com"}
_ANTHROPIC_VERSION = "2023-06-01"
_DEFAULT_MAX_TOKENS = 1024  # the Messages API requires one; llm/v1 makes it optional


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


class _VendorError(HandlerError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def tool_error(code: str, message: str) -> dict[str, Any]:
    """An interface error as a connector returns it."""
    body = {"error": code, "message": message}
    return {
        "content": [{"type": "text", "text": orjson.dumps(body).decode()}],
        "structuredContent": body,
        "isError": True,
    }


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
        if name != "llm_complete":
            return tool_error("unavailable", f"the llm connector has no tool '{name}'")
        if self._out_of_reach is not None:
            return tool_error("unavailable", self._out_of_reach)
        model = arguments.get("model") or self.settings.model
        if model != self.settings.model and model not in self.settings.models:
            allowed = ", ".join((self.settings.model, *self.settings.models))
            return tool_error("refused", f"model '{model}' is not offered by this service; it offers: {allowed}")
        try:
            if self.settings.endpoint == "anthropic":
                output = await self._anthropic(model, arguments)
            else:
                output = await self._openai(model, arguments)
        except _VendorError as failure:
            return tool_error(failure.code, failure.message)
        return {
            "content": [{"type": "text", "text": orjson.dumps(output).decode()}],
            "structuredContent": output,
            "isError": False,
        }

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        try:
            reply = await self._http.post(
                path, content=orjson.dumps(body), headers={"content-type": "application/json", **headers}
            )
        except httpx.TimeoutException:
            raise _VendorError(
                "unavailable", f"the provider did not answer within {self.settings.timeout:.0f} s"
            ) from None
        except httpx.HTTPError as exc:
            raise _VendorError("unavailable", f"the provider could not be reached ({type(exc).__name__})") from None
        except EgressRefusedError as exc:
            raise _VendorError("unavailable", str(exc)) from None
        try:
            data = orjson.loads(reply.content) if reply.content else {}
        except orjson.JSONDecodeError:
            raise _VendorError(
                "unavailable", f"the provider answered HTTP {reply.status_code} with a body that is not JSON"
            ) from None
        if reply.status_code >= 400:
            raise _vendor_failure(reply.status_code, data)
        if not isinstance(data, dict):
            raise _VendorError("unavailable", "the provider's answer is not a JSON object")
        return data

    async def _openai(self, model: str, args: Mapping[str, Any]) -> dict[str, Any]:
        messages = [{"role": "system", "content": args["system"]}] if args.get("system") else []
        messages += [{"role": m["role"], "content": m["content"]} for m in args["messages"]]
        body: dict[str, Any] = {"model": model, "messages": messages}
        if "maxTokens" in args:
            body["max_tokens"] = args["maxTokens"]
        if "temperature" in args:
            body["temperature"] = args["temperature"]
        data = await self._post("/v1/chat/completions", body, {"authorization": f"Bearer {self.settings.api_key}"})
        try:
            choice = data["choices"][0]
            message = choice["message"]
            usage = data.get("usage") or {}
            if message.get("refusal") or choice.get("finish_reason") == "content_filter":
                raise _VendorError(
                    "refused", message.get("refusal") or "the provider's content filter stopped the reply"
                )
            stop = {"stop": "end", "length": "max_tokens"}.get(choice.get("finish_reason") or "stop", "end")
            return {
                "text": message.get("content") or "",
                "stopReason": stop,
                "usage": {
                    "inputTokens": int(usage.get("prompt_tokens", 0)),
                    "outputTokens": int(usage.get("completion_tokens", 0)),
                },
            }
        except (KeyError, IndexError, TypeError, ValueError):
            raise _VendorError("unavailable", "the provider's answer lacks choices[0].message") from None

    async def _anthropic(self, model: str, args: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": args.get("maxTokens", _DEFAULT_MAX_TOKENS),
            "messages": [{"role": m["role"], "content": m["content"]} for m in args["messages"]],
        }
        if args.get("system"):
            body["system"] = args["system"]
        if "temperature" in args:
            body["temperature"] = min(float(args["temperature"]), 1.0)  # the Messages API caps it at 1
        data = await self._post(
            "/v1/messages", body, {"x-api-key": self.settings.api_key, "anthropic-version": _ANTHROPIC_VERSION}
        )
        try:
            stop_reason = data.get("stop_reason") or "end_turn"
            if stop_reason == "refusal":
                raise _VendorError("refused", "the model declined to answer")
            text = "".join(block.get("text", "") for block in data["content"] if block.get("type") == "text")
            usage = data.get("usage") or {}
            stop = {"max_tokens": "max_tokens", "stop_sequence": "stop_sequence"}.get(stop_reason, "end")
            return {
                "text": text,
                "stopReason": stop,
                "usage": {
                    "inputTokens": int(usage.get("input_tokens", 0)),
                    "outputTokens": int(usage.get("output_tokens", 0)),
                },
            }
        except (KeyError, TypeError, ValueError, AttributeError):
            raise _VendorError("unavailable", "the provider's answer lacks its content blocks") from None


def _vendor_failure(status: int, data: Any) -> _VendorError:
    """A vendor's HTTP error, mapped onto llm/v1's errors with the vendor's own words kept short."""
    error = data.get("error") if isinstance(data, dict) else None
    detail = ""
    kinds: set[str] = set()
    if isinstance(error, dict):
        detail = str(error.get("message") or "")[:300]
        kinds = {str(error.get("type") or ""), str(error.get("code") or "")}
    if status == 429 or kinds & {"rate_limit_error", "rate_limit_exceeded", "insufficient_quota"}:
        return _VendorError("limit", f"the provider's rate limit or quota was reached: {detail or 'HTTP 429'}")
    if kinds & {"content_policy_violation", "content_filter"}:
        return _VendorError("refused", f"the provider refused the content: {detail}")
    if status in (401, 403):
        return _VendorError(
            "unavailable",
            f"the provider refused the binding's key (HTTP {status}); the key may be wrong, revoked or lack access",
        )
    return _VendorError("unavailable", f"the provider answered HTTP {status}" + (f": {detail}" if detail else ""))
