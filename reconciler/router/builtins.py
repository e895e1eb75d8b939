"""The built-in `handler` interface for every profile: `handler_status`, `handler_decide` (docs/architecture.md §6).

They answer from the governance gate: the status of a held call (with the original tool's validated
output once it ran), and the decision an orchestrator takes on a hold routed to it (`to = "caller"`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from reconciler.config.models import Annotations, Tool
from reconciler.governance.gate import CallRequest, Gate, HoldStatus

__all__ = ["BUILTIN_INTERFACE", "BUILTIN_KEY", "BUILTIN_TOOLS", "run_builtin"]

BUILTIN_INTERFACE: Final = "handler"
BUILTIN_KEY: Final = "handler/v1"  # its name/vN, as the call log spells every interface

# A request id is `req_` and hex (`holds.new_request_id`): letters, digits, '_' and '-' let any id the store made
# through, and a NUL (which PostgreSQL refuses even in a lookup) never reaches the store.
_REQUEST_ID = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9_-]+$",
               "description": "the request_id a pending result gave"}
_STATUS_OUTPUT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["status", "message"],
    "properties": {
        "status": {"enum": ["pending", "executed", "rejected", "failed", "blocked", "unknown"]},
        "message": {"type": "string"},
        # The held tool's own output, already validated against that tool's outputSchema: the one
        # open object the S2 rule allows.
        "result": {"type": "object"},
        "charged": {"type": "number", "minimum": 0,
                    "description": "what the held call cost once it ran, USD (0 when it failed)"},
        "waiting": {"type": "array", "items": {"type": "object"},
                    "description": "without a request_id: each call held for your decision (request_id, profile, "
                                   "instance, tool, arguments, reason)"},
    },
}

BUILTIN_TOOLS: Final = (
    Tool(
        name="handler_status",
        description=("Tell what became of a call that was held for approval: pending, executed (with its "
                     "result), rejected or failed. Give the request_id its pending result named. Without a "
                     "request_id: the calls of agents you started that wait for your decision (handler_decide)."),
        inputSchema={"type": "object", "additionalProperties": False,
                     "properties": {"request_id": _REQUEST_ID}},
        outputSchema=_STATUS_OUTPUT,
        annotations=Annotations(readOnlyHint=True),
    ),
    Tool(
        name="handler_decide",
        description=("Approve or reject a call held for you: only the instance that started the held agent "
                     "may decide its holds, never the held agent itself. Give a reason: the held agent reads it."),
        inputSchema={"type": "object", "additionalProperties": False, "required": ["request_id", "decision"],
                     "properties": {"request_id": _REQUEST_ID, "decision": {"enum": ["approve", "reject"]},
                                    "reason": {"type": "string", "maxLength": 500,
                                               "description": "why, in a sentence the held agent reads"}}},
        outputSchema=_STATUS_OUTPUT,
        annotations=Annotations(readOnlyHint=False, destructiveHint=False),
    ),
)


async def run_builtin(gate: Gate, name: str, arguments: Mapping[str, Any],
                      caller: CallRequest) -> tuple[bool, dict[str, Any]]:
    """Ask the gate; (is_error, structured result). Only a refused decision is an error result."""
    if name == "handler_status" and "request_id" not in arguments:
        return False, await _waiting(gate, caller)
    request_id = str(arguments["request_id"])
    status: HoldStatus
    if name == "handler_status":
        status = await gate.status(request_id, caller)
    else:
        status = await gate.decide(request_id, arguments["decision"], caller, arguments.get("reason"))
    out: dict[str, Any] = {"status": status.status, "message": status.message}
    if status.result is not None:
        out["result"] = dict(status.result)
    if status.charged is not None:
        out["charged"] = status.charged
    return name == "handler_decide" and status.status == "blocked", out


async def _waiting(gate: Gate, caller: CallRequest) -> dict[str, Any]:
    """handler_status without a request id: what waits on this caller, a proven run that started other agents."""
    waiting = [dict(w) for w in await gate.waiting(caller)]
    if waiting:
        message = (f"{len(waiting)} call(s) of agents you started wait for your decision: approve or reject each "
                   "with handler_decide, giving a reason the agent reads.")
    elif not caller.proven:
        message = ("Nothing waits on this session: it presented no run's secret, so no agent's call is routed to it. "
                   "Give a request_id to follow a call of your own.")
    else:
        message = "Nothing waits for your decision now."
    return {"status": "pending" if waiting else "unknown", "message": message, "waiting": waiting}
