"""The project's `_meta` keys, and reading the cost a connector reports (docs/architecture.md §6, §7).

Requests carry who calls (`handler/interface`, `handler/instance`, `handler/parentInstance`: the
bridge adds them); results carry what happened (`handler/status`, `handler/cost`, `handler/budget`,
`handler/cause`, `handler/retry`, and on an error result the fields of its text body: `handler/error`,
`handler/requestId`). Every room names a key through these constants, never as a string of its own.

An agent run's id (`handler/instance`, `handler/parentInstance`) is whatever the client says, so it is
checked before anything keeps it (`run_id_problem`): a string of at most `MAX_RUN_ID_CHARS` characters, none
of them a control character, and UTF-8 (what a client reads from its environment may not be). The store keeps it
in columns of 200 characters, on its own and inside longer values (the approver of a hold its run
decides, `instance <id>`), and PostgreSQL refuses a NUL in text: a longer id, or one holding a NUL,
would have been refused with the audit rows and spend of every call committed beside it, again at each
retry.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "ATTACH",
    "ATTACHED",
    "BUDGET",
    "BUILTINS",
    "BUILTINS_ELSEWHERE",
    "CAUSE",
    "COST",
    "ENDED",
    "ERROR",
    "INSTANCE",
    "INTERFACE",
    "MAX_RUN_ID_CHARS",
    "MOST_USD",
    "PARENT_INSTANCE",
    "PAUSED",
    "PAUSES",
    "PROFILE",
    "RELAY",
    "REQUEST_ID",
    "RETRY",
    "RETRY_AFTER_DECISION",
    "RETRY_LATER",
    "RETRY_NEVER",
    "RUN_PREFIX",
    "SECRET",
    "SESSION",
    "STATUS",
    "STOPPING",
    "caller_meta",
    "minted_run_id",
    "read_reported_cost",
    "run_id_problem",
    "secret_digest",
]

INTERFACE: Final = "handler/interface"
INSTANCE: Final = "handler/instance"
PARENT_INSTANCE: Final = "handler/parentInstance"
# An agent run's secret, minted by the router for its run: what proves a session's instance (the bridge presents it
# at attach). Never logged, never in a result.
SECRET: Final = "handler/secret"  # noqa: S105 - a key's name, not a secret
PROFILE: Final = "handler/profile"  # the caller's profile, as the router tells the built-in agent connector
STATUS: Final = "handler/status"
COST: Final = "handler/cost"
BUDGET: Final = "handler/budget"
CAUSE: Final = "handler/cause"
ERROR: Final = "handler/error"  # an error result's code
# On every result that is not executed: whether calling again can help (docs/router.md "Retrying").
RETRY: Final = "handler/retry"
RETRY_LATER: Final = "later"  # the same call may succeed later (a timeout, a crash, a busy service)
RETRY_NEVER: Final = "never"  # the same call fails again: change it, or do without (a refusal, a service not set up)
RETRY_AFTER_DECISION: Final = "after_decision"  # a person decides a held call first: ask handler_status
REQUEST_ID: Final = "handler/requestId"  # a held result's request_id
# "elsewhere": another entry of the host's configuration serves the built-in tools, so this one lists none of them.
BUILTINS: Final = "handler/builtins"
BUILTINS_ELSEWHERE: Final = "elsewhere"
ATTACH: Final = "handler/attach"  # the bridge's handoff line
ATTACHED: Final = "handler/attached"  # the router's answer to it
INPUT_ENDED: Final = "handler/inputEnded"  # a relaying bridge to the router: the agent closed its stdin
RELAY: Final = "handler/relay"  # in an attach line without descriptors: the bridge relays the session's lines
SESSION: Final = "handler/session"  # the session's signed record, router to bridge and back at a re-attach
ENDED: Final = "handler/ended"  # the handed-over session is over: the bridge exits rather than re-attach
# The router is stopping: a relaying bridge sends no more of the agent's lines (they wait for the next router) and
# answers `PAUSED` once it has sent its last, so the router knows it has read every line it will be sent. A bridge
# that does says `PAUSES` first; the router waits for no other's.
STOPPING: Final = "handler/stopping"
PAUSED: Final = "handler/paused"
PAUSES: Final = "handler/pauses"

# Where a caller's identity comes from when a client is started by whoever launches the agent.
_CALLER_ENV: Final = (("HANDLER_INSTANCE", INSTANCE), ("HANDLER_PARENT_INSTANCE", PARENT_INSTANCE))

# The most any amount of money may be, in USD: a price or a cap in the tree, a cost a connector reports, a change of
# balance. Sums of such amounts in micro-dollars stay far inside the store's 64-bit integers.
MOST_USD: Final = 1_000_000_000

MAX_RUN_ID_CHARS: Final = 128  # a UUID is 36; the store's columns of 200 hold it with a prefix
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1: NUL among them
# A byte of the environment that is not UTF-8 reaches Python as a lone surrogate, which no JSON line can carry.
_SURROGATE = re.compile("[\ud800-\udfff]")


def run_id_problem(value: object) -> str | None:
    """What is wrong with an agent run's id as the caller gave it, or None when it may be kept."""
    if not isinstance(value, str):
        return "must be a string, an agent run's id"
    if len(value) > MAX_RUN_ID_CHARS:
        return f"is {len(value)} characters long; an agent run's id has at most {MAX_RUN_ID_CHARS}"
    if _CONTROL.search(value) is not None:
        return "holds a control character; an agent run's id is printable text"
    if _SURROGATE.search(value) is not None:
        return "is not UTF-8 text; an agent run's id is printable text"
    return None


RUN_PREFIX: Final = "run-"  # the ids the router mints for the agent runs it starts: "run-" and 16 hex digits
_MINTED = re.compile(r"run-[0-9a-f]{16}")


def minted_run_id(value: str) -> bool:
    """Whether `value` has the shape of a run id the router minted: such an id counts only when its secret proves it
    (docs/agents.md); claimed without, it would spend that run's allowance and count against its limits."""
    return value.startswith(RUN_PREFIX) and _MINTED.fullmatch(value) is not None


def secret_digest(secret: str) -> str:
    """What the router keeps of an agent run's secret: its SHA-256, so a secret is never held or compared as text."""
    return hashlib.sha256(secret.encode(errors="replace")).hexdigest()


def caller_meta(interface: str, env: Mapping[str, str], *, builtins: bool = True) -> dict[str, str]:
    """The `_meta` a client of the router adds to its requests: the interface, the instances `env` names (and the
    secret of its run, `HANDLER_INSTANCE_SECRET`, which proves them), and,
    unless `builtins`, that the built-in tools are served by another entry of the host's configuration.

    ValueError names the variable whose run id the router would refuse, why, and what to do."""
    meta = {INTERFACE: interface}
    if not builtins:
        meta[BUILTINS] = BUILTINS_ELSEWHERE
    for name, key in _CALLER_ENV:
        if env.get(name):
            problem = run_id_problem(env[name])
            if problem is not None:
                raise ValueError(f"{name} {problem}; set it to the agent run's id, or unset it to have one made per "
                                 "connection")
            meta[key] = env[name]
    if env.get("HANDLER_INSTANCE_SECRET"):
        meta[SECRET] = env["HANDLER_INSTANCE_SECRET"]
    return meta


def read_reported_cost(result: Mapping[str, Any]) -> float | None:
    """The cost in USD a connector reported in its result's `_meta`, or None when it reported none usable.

    Only a finite number that is not negative counts (a boolean is not a number here): anything else is
    treated as not reported, and the call is charged its estimate. A report above `MOST_USD` is read as
    `MOST_USD`: still more than any price, so a pricing violation, and a sum the store can hold (1e300
    made micro-dollars past 64 bits, and every settlement path failed on them).
    """
    meta = result.get("_meta")
    cost = meta.get(COST) if isinstance(meta, Mapping) else None
    if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0 and math.isfinite(cost):
        return float(min(cost, MOST_USD))
    return None
