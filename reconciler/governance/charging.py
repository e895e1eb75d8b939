"""What a settled call is charged: its reported cost, never above its reservation (docs/architecture.md §7).

A binding's `[pricing]` value for a tool is the most one call of it may cost; it is what admission
reserves against the caps and the balance. A connector reporting more (`_meta["handler/cost"]`)
is charged the reservation and the excess is recorded as a pricing violation — an audit row
`pricing_violation` naming the binding, tool, reported and reserved amounts, and a warning in the
log — so a connector can never spend past a cap that admission checked. A tool with no price
reserves nothing and so is charged nothing, whatever its connector says (and that is a violation
too when it says more than zero). Called by `admissions` (calls admitted at once) and by the
ledger (approved holds).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from reconciler.governance.rulebook import from_micros
from reconciler.governance.store.audit import AuditRow, audit_row

__all__ = ["Charge", "Charged", "PricedCall", "charge_call"]

log = logging.getLogger("handler.governance")


class Charged(Protocol):
    """Who a charge is for, as a violation names it (`PricedCall`, or a capped call's ticket)."""

    @property
    def request_id(self) -> str | None: ...

    @property
    def profile(self) -> str: ...

    @property
    def instance(self) -> str: ...

    @property
    def binding(self) -> str: ...

    @property
    def tool(self) -> str: ...


@dataclass(slots=True)  # a frozen dataclass takes four times as long to build
class PricedCall:
    """Who a charge is for, as the violation names it."""

    request_id: str | None
    profile: str
    instance: str
    binding: str
    tool: str


@dataclass(slots=True)
class Charge:
    charged: int  # micros: min(reported, reserved); for a failed call 0 unless it may have cost
    violation: AuditRow | None = None  # the audit row of a report above the reservation


def charge_call(call: Charged, reserved: int, reported: int | None, ok: bool) -> Charge:
    """The charge of a settled call at `reported` micros (None: not reported, so the reservation).

    A failed call is released: charged nothing, unless `reported` says what it may have cost (a call
    that ended unanswered, which may have reached the provider, is charged its price), never more than
    its reservation. A report above the reservation is charged the reservation, and the returned
    violation row must be recorded with the settlement.
    """
    if not ok:
        return Charge(0 if reported is None else min(reported, reserved))
    if reported is None or reported <= reserved:
        return Charge(reserved if reported is None else reported)
    log.warning("pricing violation: binding '%s' tool %s reported $%.6f, above the $%.6f reserved; charged "
                "$%.6f (request %s)", call.binding, call.tool, from_micros(reported), from_micros(reserved),
                from_micros(reserved), call.request_id)
    row = audit_row("pricing_violation", request_id=call.request_id, profile=call.profile, instance=call.instance,
                    tool=call.tool, status="executed",
                    detail={"binding": call.binding, "tool": call.tool, "reported": reported, "reserved": reserved,
                            "charged": reserved})
    return Charge(reserved, row)
