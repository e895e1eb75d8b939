"""The `CallToolResult` shapes of docs/router.md "Tool results": executed, an interface error, a hold or a refusal.

Executed: `structuredContent` is the connector's validated output and the first text block holds its
JSON; when governance priced the call, a second text block tells the model the status, the charge
and the budget left (most hosts never show `_meta` to the model). `_meta` carries `handler/status`,
`handler/cost` and `handler/budget`.

Every other outcome is a tool result with `isError: true` and NO `structuredContent`: a client that
validates `structuredContent` against the tool's `outputSchema` even on an error (the TypeScript
SDK does) would otherwise throw, and the model would never read why. Its one text block is the
JSON body (`{"error", "message"}`, `{"status": "pending", "message", "request_id"}`,
`{"status": "blocked", "message"}`), and `_meta` repeats its machine-readable fields
(`handler/status`, `handler/error`, `handler/cause`, `handler/requestId`) and says whether calling again
can help (`handler/retry`: `later`, `never`, `after_decision`; the table is docs/router.md "Retrying").
`reconciler.wire.results.result_body` reads either shape back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from reconciler.governance.gate import Settlement
from reconciler.router.errors import ToolError
from reconciler.wire import meta as meta_keys

__all__ = ["EncodedResult", "error_result", "executed_result", "held_result", "priced_note"]


def _text(body: Any) -> list[dict[str, str]]:
    return [{"type": "text", "text": orjson.dumps(body).decode()}]


@dataclass(frozen=True, slots=True)
class EncodedResult:
    """An executed result with its output serialized once: `content`'s text and `structuredContent`
    are spliced from the same bytes rather than serializing the output twice (outputs can be large).
    `note` is the priced call's second text block, already encoded as a JSON string (or empty)."""

    structured: bytes
    meta: dict[str, Any]
    note: bytes = b""

    def to_json(self, stateless: bool) -> bytes:
        text = orjson.dumps(self.structured.decode())  # the output's JSON as a JSON string
        second = b',{"type":"text","text":' + self.note + b"}" if self.note else b""
        tail = b',"resultType":"complete"}' if stateless else b"}"
        return (b'{"content":[{"type":"text","text":' + text + b"}" + second + b'],"structuredContent":'
                + self.structured + b',"isError":false,"_meta":' + orjson.dumps(self.meta) + tail)


def priced_note(settlement: Settlement) -> str:
    """The text a model reads of a priced call: executed, what it cost, what is left."""
    left = "no spending cap applies" if settlement.remaining is None else f"budget left: {_usd(settlement.remaining)}"
    return f"handler: executed; charged {_usd(settlement.charged)}; {left}"


# Notes worked out once per price, JSON-encoded: a model's calls of one tool cost the same. For speed (the capped
# and priced lines of `benchmarks/router.py`): an uncapped call's note is whole; a capped call's is its head (up to
# "$"), joined in `executed_result` itself to the budget left (digits and a point: nothing JSON escapes) and the
# closing quote (a call less for each capped call, measured with the lanes' change it came with: benchmarks/README.md);
# the note of the last capped settlement is kept with it, for the calls governance settles together. The budget's
# digits are orjson's, which every result's `_meta` runs anyway, and are checked with comparisons alone: in a loop,
# `_usd`'s float formatting costs 70 ns more, but in the router, where a call runs far more code than the caches
# hold, code run for this note alone cost a capped call about 3 µs of the event loop's CPU with `_usd` (the capped
# side-by-side line on SQLite read 82.4% of the open gate before, 87.5-88.3% after), and 1.8 µs more with the digits
# checked by `bytes` methods (three routers of each, `benchmarks/README.md`). Governance tells amounts in whole micros
# (`Settlement`); the tests hold the note to `priced_note`, byte for byte, for every such amount.
_UNCAPPED_NOTES: dict[float, bytes] = {}
_CAPPED_HEADS: dict[float, bytes] = {}
_NOTES_KEPT = 4096  # reported costs that vary: kept from growing
_PLAIN_BELOW = 1e-5  # USD: orjson writes less with an exponent ("1e-6")
_EXACT_BELOW = 1e9  # USD: below it, the shortest digits of an amount in whole micros are its `.6f` digits
_ZERO = ord("0")
_last_capped: tuple[Settlement | None, bytes] = (None, b"")  # the last capped settlement seen, and its note


def _uncapped_note(settlement: Settlement) -> bytes:
    if len(_UNCAPPED_NOTES) >= _NOTES_KEPT:
        _UNCAPPED_NOTES.clear()
    note = _UNCAPPED_NOTES[settlement.charged] = orjson.dumps(priced_note(settlement))
    return note


def _capped_head(charged: float) -> bytes:
    """The note of a capped call at this price up to the budget left, JSON-encoded without its closing quote."""
    if len(_CAPPED_HEADS) >= _NOTES_KEPT:
        _CAPPED_HEADS.clear()
    head = _CAPPED_HEADS[charged] = orjson.dumps(f"handler: executed; charged {_usd(charged)}; budget left: $")[:-1]
    return head


def _usd(amount: float) -> str:
    return "$" + (f"{amount:.6f}".rstrip("0").rstrip(".") or "0")


def executed_result(structured: dict[str, Any], settlement: Settlement | None) -> EncodedResult:
    meta: dict[str, Any] = {meta_keys.STATUS: "executed"}
    note = b""
    if settlement is not None:
        meta[meta_keys.COST] = settlement.charged
        meta[meta_keys.BUDGET] = settlement.remaining
        remaining = settlement.remaining
        if remaining is not None:  # governance priced it against a cap or balance
            global _last_capped  # noqa: PLW0603 - one entry, replaced whole
            last = _last_capped
            if last[0] is settlement:  # told to the call before too (governance hands the same one out)
                note = last[1]
            else:
                head = _CAPPED_HEADS.get(settlement.charged) or _capped_head(settlement.charged)
                if _PLAIN_BELOW <= remaining < _EXACT_BELOW:
                    # The shortest digits that read back as it, which are `_usd`'s for an amount in whole micros; only
                    # a whole amount ends in "0" ("12.0"), whose point and zero `_usd` leaves out.
                    digits = orjson.dumps(remaining)
                    note = b"".join((head, digits[:-2] if digits[-1] == _ZERO else digits, b'"'))
                else:  # none left, or what orjson writes with an exponent
                    note = head + _usd(remaining)[1:].encode() + b'"'
                _last_capped = (settlement, note)
        elif settlement.charged > 0:  # priced, no cap: the note of a price, worked out once
            note = _UNCAPPED_NOTES.get(settlement.charged) or _uncapped_note(settlement)
    return EncodedResult(orjson.dumps(structured), meta, note)


def error_result(error: ToolError) -> dict[str, Any]:
    body = {"error": error.code, "message": error.message}
    meta: dict[str, Any] = {meta_keys.STATUS: "error", meta_keys.ERROR: error.code, meta_keys.RETRY: error.retry}
    if error.cause is not None:
        meta[meta_keys.CAUSE] = error.cause
    return {"content": _text(body), "isError": True, "_meta": meta}


def held_result(body: dict[str, Any], status: str) -> dict[str, Any]:
    """A hold (`pending`, with its request_id) or a refusal (`blocked`)."""
    # A hold waits for a person; a refusal (a rule, a cap, a suspension) stands until someone changes the config.
    retry = meta_keys.RETRY_AFTER_DECISION if status == "pending" else meta_keys.RETRY_NEVER
    meta: dict[str, Any] = {meta_keys.STATUS: status, meta_keys.RETRY: retry}
    if body.get("request_id") is not None:
        meta[meta_keys.REQUEST_ID] = body["request_id"]
    return {"content": _text(body), "isError": True, "_meta": meta}
