"""The seam between the router's call pipeline and governance (docs/architecture.md §2 step 5, §7).

The router asks a `Gate` to admit every call before dispatch and to settle it after; it serves the
built-in `handler_status` and `handler_decide` tools by asking the gate too. `OpenGate` admits
everything and is what runs when no store is configured; the governance room's `GovernedGate` is the
real gate (decision, holds, spend).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from reconciler.config.snapshot import Snapshot

__all__ = ["Admission", "CallRequest", "CallResult", "Executor", "Gate", "HoldStatus", "OpenGate", "Settlement",
           "Ticket"]


# CallRequest, Admission and Settlement are built on every call: plain slots, not frozen (a frozen
# dataclass takes four times as long to build).
@dataclass(slots=True)
class CallRequest:
    """One tools/call after validation, as governance sees it (arguments only for holds)."""

    profile: str
    instance: str
    parent_instance: str | None
    interface: str  # "ocr/v1"
    tool: str
    binding: str
    arguments: Mapping[str, Any]
    estimated_cost: float = 0.0  # the binding's [pricing]: the most the call may cost, reserved at admission
    # The router's own object for this profile's tool while one snapshot is served (its plan), the same for every
    # such call; a gate may key what it works out once per profile, tool and price by it. None: no such object.
    route: object | None = None
    # Whether the router proved `instance` and `parent_instance` by the secret of an agent run it started (else the
    # client only claimed them): a hold routed to the caller is decided only by a proven parent.
    proven: bool = False
    member: str | None = None  # a proven run that a member started (no parent run): that member decides its holds


class Ticket(Protocol):
    """An executed call's charge as the gate that admitted it keeps it, one kind per way of admitting (governance:
    `lanes.LaneTicket` for a call on its lane, leased or not, `admissions`' leased and reserved tickets for a capped
    call off its lane, `ledger.HeldTicket` for an approved hold as it runs). Settling it records what the call cost,
    and says what it was charged (docs/architecture.md §7)."""

    def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement: ...


@dataclass(slots=True, eq=False)  # each is its call's own: compared and hashed by identity, a gate's handle on it
class Admission:
    status: Literal["executed", "pending", "blocked"]  # executed = run it now
    message: str = ""
    request_id: str | None = None
    ticket: Ticket | None = None  # an executed call's charge, settled by the gate that admitted it
    trace: tuple[Mapping[str, Any], ...] = ()


@dataclass(slots=True)
class Settlement:
    """What a settled call is told, in USD: governance's amounts are whole micros (a note reads them so)."""

    charged: float = 0.0
    remaining: float | None = None  # budget left, when a cap or balance applies


@dataclass(frozen=True, slots=True)
class HoldStatus:
    """What `handler_status` reports for a request id."""

    status: Literal["pending", "executed", "rejected", "failed", "blocked", "unknown"]
    message: str = ""
    result: Mapping[str, Any] | None = field(default=None)
    charged: float | None = None  # what an executed hold cost, USD


@dataclass(frozen=True, slots=True)
class CallResult:
    """How an admitted call ran: what the router's `run_admitted` returns, whether the call was admitted
    at once or held and approved (then the hold runner stores it with the hold and settles it)."""

    ok: bool
    output: Mapping[str, Any]  # the validated output; when not ok, {"error": code, "message": why}
    # What the connector reported the call cost, USD (None: it did not say); when not ok, what the call is charged
    # (its price when it may have reached the provider; None: nothing), as the call log says.
    cost: float | None = None
    settlement: Settlement | None = None  # what the gate charged, when the call was settled on its way
    # Why it failed, for people (a held call's page, `handler approvals show`, the audit trail): the
    # router's cause and what the connector said, which the agent's `output` leaves out.
    cause: str | None = None


# Runs an approved hold through the router's steps 3-4 and 6-10 (`Router.execute_held`). The hold is
# settled by the gate: at the reported cost when there is one, else at the estimate, never above what
# was reserved (docs/architecture.md §7).
Executor = Callable[[CallRequest], Awaitable[CallResult]]


class Gate(Protocol):
    async def admit(self, snapshot: Snapshot, call: CallRequest) -> Admission: ...

    async def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        """Charge an admitted call: `actual_cost` as its connector reported it (None: its estimate), never more
        than was reserved for it. When not `ok`: nothing, or `actual_cost` when given (what the connector reported,
        or the price of a call that may have reached the provider)."""
        ...

    async def status(self, request_id: str, caller: CallRequest) -> HoldStatus: ...

    async def decide(
        self, request_id: str, decision: Literal["approve", "reject"], caller: CallRequest, reason: str | None = None
    ) -> HoldStatus: ...

    async def waiting(self, caller: CallRequest) -> list[Mapping[str, Any]]:
        """The pending holds routed to `caller` as the proven parent run of their agent: what it may decide."""
        ...

    async def withdraw(self, instance: str, why: str) -> int:
        """Reject the pending holds of the agent run `instance`, which ended (`why`: how): a held call never runs
        after its run. How many were withdrawn."""
        ...

    def report_unready(self, snapshot: Snapshot, binding: str, cause: str, message: str) -> None:
        """A call failed because `binding` cannot start until a person sets it up (`message` says what is missing,
        for owners): tell its owners, once per cause (`governance.alerts`). Called on the event loop; never waits."""
        ...


class OpenGate:
    """Admits every call at once and holds nothing: the pipeline without governance."""

    async def admit(self, snapshot: Snapshot, call: CallRequest) -> Admission:
        return Admission("executed", "no governance configured")

    async def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        return Settlement(charged=actual_cost or 0.0)

    async def status(self, request_id: str, caller: CallRequest) -> HoldStatus:
        return HoldStatus("unknown", f"no request '{request_id}': nothing is ever held without governance")

    async def decide(self, request_id: str, decision: Literal["approve", "reject"], caller: CallRequest,
                     reason: str | None = None) -> HoldStatus:
        return HoldStatus("unknown", f"no request '{request_id}': nothing is ever held without governance")

    async def waiting(self, caller: CallRequest) -> list[Mapping[str, Any]]:
        return []

    async def withdraw(self, instance: str, why: str) -> int:
        return 0

    def report_unready(self, snapshot: Snapshot, binding: str, cause: str, message: str) -> None:
        return None  # no store, no owners to tell: the router's log says it
