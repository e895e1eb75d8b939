"""The call, in order (docs/architecture.md §2 steps 2-10): one `tools/call` from a resolved name to its logged reply.

Step 1 (framing) happened in `framing`; `run_tools_call` runs the rest, each step a function below:
`resolve_tool` (2), `validate_input` (3), `resolve_files` (4, in `files`), `govern` (5), `take_slot`
and `wait_for_slot` (6), `prepare` and the connector's call (7), `map_errors` (8), `validate_output`
(9), then (10) the output files (`CallFolder.deliver`), `Gate.settle` and the log line, which is
written whatever step ended the call. `run_admitted` runs 6-10 of an admitted call and returns its
`CallResult`; a hold, once approved, takes the same way (`run_held`: 2 on the binding it was held
on, 3-4, then `run_admitted`), and its `CallResult` goes back to the gate. Each step may end the
call by raising: a `JsonRpcError` (only malformed params) or a `ToolError`, which becomes a tool
result with `isError: true`. Nothing after the ending step runs, except the settlement of an admitted
call and the log line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.config.models import Limits
from reconciler.config.snapshot import Snapshot
from reconciler.connectors.errors import (
    ConnectorError,
    ConnectorNotSetUpError,
    ConnectorOutputInvalidError,
    ConnectorReplyError,
    ConnectorRestartingError,
)
from reconciler.connectors.pool import ConnectorPool, RunningConnector, Supervisor, pool_key
from reconciler.governance.errors import StoreError
from reconciler.governance.gate import Admission, CallRequest, CallResult, Gate
from reconciler.router.builtins import run_builtin
from reconciler.router.calllog import CallLog, CallRecord
from reconciler.router.errors import ToolError, invalid_arguments, unavailable
from reconciler.router.files import CallFolder, FileArg, resolve_files, restore_paths
from reconciler.router.generation import MOST_OUTPUT_DEPTH, Generation, ToolPlan, View
from reconciler.router.limits import DEFAULT_TIMEOUT_SECONDS, LimitBook, LimitKey, concurrency_error, timeout_error
from reconciler.router.outcomes import EncodedResult, error_result, executed_result, held_result
from reconciler.wire.errors import INVALID_PARAMS, JsonRpcError
from reconciler.wire.meta import INSTANCE, PARENT_INSTANCE, PROFILE, RETRY, RETRY_LATER, RETRY_NEVER, read_reported_cost

__all__ = ["Caller", "Services", "check_arguments", "run_admitted", "run_held", "run_tools_call"]

log = logging.getLogger("handler.router")
_NO_PATHS: dict[str, str] = {}  # no connector-side paths to map back (never written to)
_call_ids = itertools.count(1)
_SHOWN_NAME = 100  # characters of an unexpected output name the call log shows
MOST_MESSAGE = 2000  # characters of a declared error's message the model reads
# What gets a connector's progress notifications for one call (their params), when its caller asked for progress.
OnProgress = Callable[[Mapping[str, Any]], None]
_NOT_THE_INTERFACE = "the service returned a result that does not match the interface; retrying later may work"
# What the model reads of a binding that cannot start: never the vendor, the secret or the program (its owners are
# told those), and that no retry helps, since a person must act first.
NOT_SET_UP = "this service is not set up on this machine; an owner has been told; retrying will not help"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the profile (from the socket), the agent run and the run that started it."""

    profile: str
    instance: str
    parent: str | None
    proven: bool = False  # instance and parent proven by an agent run's secret (`runs.AgentRuns`)
    member: str | None = None  # of a proven run started by a member (no parent run): that member


@dataclass(frozen=True, slots=True)
class Services:
    """What the pipeline uses from the router; fixed for the router's life."""

    gate: Gate
    pool: ConnectorPool
    limits: LimitBook
    log: CallLog
    calls_dir: Path  # per-call folders of connector processes
    # An agent run's secret's digest → the caller it proves (`runs.AgentRuns`; `proven` set).
    proofs: Mapping[str, Caller] = field(default_factory=dict)


async def run_tools_call(svc: Services, generation: Generation, view: View, caller: Caller,
                         params: Mapping[str, Any] | None,
                         on_progress: OnProgress | None = None) -> dict[str, Any] | EncodedResult:
    """Steps 2-10 for one tools/call; the `CallToolResult` to send, or a raised `JsonRpcError`. `on_progress` gets
    the connector's progress notifications for the call (the caller asked for progress: `progress.Progress`)."""
    name, arguments = read_call_params(params)
    started = time.perf_counter()
    try:
        plan = resolve_tool(view, name)
    except ToolError as exc:  # an error result, not a protocol error: the model reads which tools there are
        svc.log.write(CallRecord(caller.profile, caller.instance, view.key or "", name[:200], None,
                                 generation.number, started, outcome="refused", error="unknown_tool"))
        return error_result(exc)
    record = CallRecord(caller.profile, caller.instance, plan.interface, plan.name, plan.binding,
                        generation.number, started)
    try:
        result = await _run_steps(svc, generation.snapshot, plan, caller, arguments, record, on_progress)
    except ToolError as exc:
        note_error(record, exc)
        result = error_result(exc)
    except asyncio.CancelledError:  # the client cancelled it, or went away; charged as `run_admitted` decided
        record.outcome = record.cause = "cancelled"
        raise
    except Exception:  # a bug of ours must not kill the session: report it and answer unavailable
        log.exception("the router failed on a call of %s %s", plan.interface, plan.name)
        internal = unavailable("internal", "the router failed while handling this call; retrying later may work")
        record.outcome, record.error, record.cause = "error", internal.code, internal.cause
        result = error_result(internal)
    finally:
        svc.log.write(record)
    return result


def read_call_params(params: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    name = (params or {}).get("name")
    if not isinstance(name, str):
        raise JsonRpcError(INVALID_PARAMS, "tools/call needs params.name, the tool's name as a string")
    arguments = (params or {}).get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise JsonRpcError(INVALID_PARAMS, "tools/call params.arguments must be an object")
    return name, arguments


def resolve_tool(view: View, name: str) -> ToolPlan:
    """Step 2: the session's snapshot → profile → interface → tool → binding, all precomputed.

    An unknown name is `invalid_arguments` naming the tools served, as a tool result: every MCP client
    hands that to the model, where a JSON-RPC error makes several of them raise.
    """
    plan = view.tools.get(name)
    if plan is None:
        known = ", ".join(view.tools)
        raise invalid_arguments(f"unknown tool '{name[:200]}'; this session serves: {known}")
    return plan


def validate_input(plan: ToolPlan, arguments: Mapping[str, Any]) -> None:
    """Step 3: the arguments against the compiled inputSchema; the error says where and why (SEP-1303)."""
    validator = plan.compiled.input
    if validator.is_valid(arguments):
        return
    problems = []
    try:
        for error in itertools.islice(validator.iter_errors(arguments), 5):
            where = "/" + "/".join(str(p) for p in error.instance_path)
            problems.append(f"at {where}: {error.message}")
    except ValueError:  # the validator's recursion limit: values nested deeper than any schema here describes
        raise invalid_arguments("the arguments are nested too deeply to check; no tool takes values this "
                                "deep") from None
    raise invalid_arguments("the arguments do not match the tool's inputSchema: " + "; ".join(problems))


def check_arguments(plan: ToolPlan, arguments: Mapping[str, Any]) -> tuple[FileArg, ...]:
    """Steps 3 and 4: the arguments against the inputSchema, then its file arguments resolved."""
    validate_input(plan, arguments)
    if not plan.compiled.files:
        return ()
    return resolve_files(plan.compiled.files, arguments, plan.scope, plan.limits.maxFileBytes, plan.errors)


def note_error(record: CallRecord, error: ToolError) -> None:
    """The log's account of a call a `ToolError` ended."""
    record.outcome, record.error, record.cause = "error", error.code, error.cause
    record.field = record.field or error.field


async def govern(gate: Gate, snapshot: Snapshot, call: CallRequest) -> Admission:
    """Step 5: the governance seam decides executed / pending / blocked and reserves the estimate.

    A call governance cannot decide does not run: when its store fails (down, or a lock held elsewhere past the
    session's timeout), the call is `unavailable` and the operator's log says why.
    """
    try:
        return await gate.admit(snapshot, call)
    except StoreError as exc:
        raise store_failed(call, exc) from None


def store_failed(call: CallRequest, exc: StoreError) -> ToolError:
    """The `unavailable` of a call governance could not decide or answer, its store having failed; logged first."""
    log.warning("%s %s of profile '%s' not answered: %s", call.interface, call.tool, call.profile, exc)
    return unavailable("governance_store", "governance could not answer this call: its store failed; retrying "
                       "later may work")


async def _run_steps(svc: Services, snapshot: Snapshot, plan: ToolPlan, caller: Caller, arguments: dict[str, Any],
                     record: CallRecord, on_progress: OnProgress | None) -> dict[str, Any] | EncodedResult:
    files = check_arguments(plan, arguments)
    call = CallRequest(caller.profile, caller.instance, caller.parent, plan.interface, plan.name,
                       plan.binding or "", arguments, plan.price, plan, caller.proven, caller.member)
    if plan.builtin:
        try:
            is_error, out = await run_builtin(svc.gate, plan.name, arguments, call)
        except StoreError as exc:
            raise store_failed(call, exc) from None
        if not is_error:
            validate_output(plan, out)
        record.outcome = "blocked" if is_error else "executed"
        return executed_result(out, None) if not is_error else held_result(out, "blocked")
    admission = await govern(svc.gate, snapshot, call)
    if admission.status != "executed":
        record.outcome, record.request_id = admission.status, admission.request_id
        body: dict[str, Any] = {"status": admission.status, "message": admission.message}
        if admission.status == "pending":
            body["request_id"] = admission.request_id
        return held_result(body, admission.status)
    result = await run_admitted(svc, snapshot, plan, caller, arguments, files, admission, record, on_progress)
    return executed_result(dict(result.output), result.settlement)


async def run_held(svc: Services, generation: Generation, call: CallRequest) -> CallResult:
    """A hold approved (and checked again) by governance, run on the live generation: step 2 on the
    binding recorded when it was held, 3-4, then 6-10 as `run_admitted`; its failure is the result.

    Step 5 was the hold's decision. The gate settles the hold itself, so nothing is settled here.
    """
    try:
        plan = resolve_held(generation, call)
    except ToolError as exc:
        return CallResult(False, {"error": exc.code, "message": exc.message}, cause=exc.operator_text())
    record = CallRecord(call.profile, call.instance, plan.interface, plan.name, plan.binding, generation.number,
                        time.perf_counter())
    arguments = dict(call.arguments)
    try:
        files = check_arguments(plan, arguments)
        return await run_admitted(svc, generation.snapshot, plan, Caller(call.profile, call.instance,
                                  call.parent_instance), arguments, files, None, record)
    except ToolError as exc:  # charged what `run_admitted` decided (its price, if it may have reached the provider)
        note_error(record, exc)
        return CallResult(False, {"error": exc.code, "message": exc.message}, record.cost, cause=exc.operator_text())
    finally:
        svc.log.write(record)


def resolve_held(generation: Generation, call: CallRequest) -> ToolPlan:
    """Step 2 of a held call: its tool on the live generation, on the binding it was held on."""
    try:
        plan = generation.view(call.profile, call.interface).tools[call.tool]
    except (JsonRpcError, KeyError):
        raise ToolError("unavailable", f"{call.interface} {call.tool} is no longer served to profile "
                        f"'{call.profile}'") from None
    if call.binding == plan.binding:
        return plan
    if call.binding not in generation.snapshot.bindings:
        raise ToolError("unavailable", f"binding '{call.binding}' is gone")
    return dataclasses.replace(plan, binding=call.binding, pool_key=pool_key(generation.snapshot, call.binding))


def _told(plan: ToolPlan, caller: Caller) -> dict[str, Any] | None:
    """Who calls, for the connector that is told (the built-in agent: `runs.AgentRuns`); None for every other."""
    if not plan.tells_caller:
        return None
    return {PROFILE: caller.profile, INSTANCE: caller.instance, PARENT_INSTANCE: caller.parent}


async def run_admitted(svc: Services, snapshot: Snapshot, plan: ToolPlan, caller: Caller, arguments: dict[str, Any],
                       files: tuple[FileArg, ...], admission: Admission | None, record: CallRecord,
                       on_progress: OnProgress | None = None) -> CallResult:
    """Steps 6-10 of an admitted call, settled in every case; with no admission (a held call run once
    approved, whose hold the gate settles itself) nothing is settled here. A failure raises `ToolError`.

    The wait for a concurrency slot and the call share one deadline. The common case (a slot free,
    the process running, no files) awaits the connector right here, with no coroutine in between.

    A call sent is charged what its connector reported, whatever the result; reporting nothing, its price when it
    may have reached the provider (no answer: cancelled, late, the process gone; or an answer the interface refuses),
    and nothing for a declared or JSON-RPC error (docs/router.md, "Tool results").
    """
    ok = sent = declined = False
    actual: float | None = None
    book, limits, key = svc.limits, plan.limits, (caller.profile, caller.instance, plan.interface)
    timeout = limits.timeoutSeconds or DEFAULT_TIMEOUT_SECONDS
    supervisor = svc.pool.supervisor(plan.pool_key, plan.binding or "")  # the binding's process, running or not
    folder = CallFolder(svc.calls_dir / (plan.binding or "-"), f"{os.getpid()}-{next(_call_ids)}",
                        supervisor.host_uid) if files else None
    taken: bool | None = False
    try:
        deadline, taken = take_slot(book, key, limits)  # step 6
        if taken is None:
            taken = await wait_for_slot(book, key, limits, deadline)
        connector, sending, back = supervisor.running(), arguments, _NO_PATHS  # step 7
        if connector is None or folder is not None:
            connector, sending, back, deadline = await prepare(supervisor, snapshot, plan, arguments, files, folder,
                                                               deadline)
        sent = True  # written before the call's first wait; cancelled from now on, it is cancelled at the connector
        raw = await connector.call_tool(plan.name, sending, _told(plan, caller), deadline, on_progress)
        if taken:
            taken = False
            book.release(key)
        actual = read_reported_cost(raw)
        try:
            structured = map_errors(plan, raw)  # step 8
        except ToolError as exc:
            declined = exc.cause is None  # an error of the interface's list, not the router's `unavailable`
            raise
        validate_output(plan, structured, record)  # step 9
        if folder is not None:  # step 10: the output files
            await asyncio.to_thread(folder.deliver, files, plan.scope, plan.limits.maxFileBytes)
            structured = restore_paths(structured, back)
        ok = True
    except TimeoutError:
        supervisor.suspect()  # a connector stuck on this call is recycled, not waited on
        raise timeout_error(timeout) from None
    except ConnectorError as exc:
        declined = isinstance(exc, ConnectorReplyError)  # a JSON-RPC error it answered with, not a process gone
        raise connector_failed(plan, exc, svc.gate, snapshot) from None
    finally:
        if taken:
            book.release(key)
        if folder is not None:
            await asyncio.to_thread(folder.remove)
        cost = actual if actual is not None else plan.price if sent and not declined else None
        settlement = await svc.gate.settle(admission, cost, ok) if admission is not None else None  # step 10
        record.cost = settlement.charged if settlement is not None else cost
    return CallResult(True, structured, actual, settlement)


def connector_failed(plan: ToolPlan, exc: ConnectorError, gate: Gate, snapshot: Snapshot) -> ToolError:
    """The `unavailable` of a connector process that failed, told to the operator in the log first, and to the
    binding's owners (once per cause, through `gate`) when it cannot start until someone sets it up.

    A JSON-RPC error's own text may quote arguments, so only its code is logged.
    """
    told = f"JSON-RPC error {exc.code}" if isinstance(exc, ConnectorReplyError) else exc.message
    log.warning("binding '%s' (%s %s): %s: %s", plan.binding, plan.interface, plan.name, exc.cause, told)
    if isinstance(exc, ConnectorRestartingError):
        return unavailable(exc.cause, f"the service crashed and waits {exc.seconds:.1f} s before it starts again; "
                           "retrying then may work", detail=told)
    if isinstance(exc, ConnectorOutputInvalidError):
        return unavailable(exc.cause, _NOT_THE_INTERFACE, field=exc.field, detail=told)
    if isinstance(exc, ConnectorNotSetUpError):
        gate.report_unready(snapshot, plan.binding or "", exc.cause, exc.message)
        return unavailable(exc.cause, NOT_SET_UP, detail=told, retry=RETRY_NEVER)
    return unavailable(exc.cause, "the service failed; retrying later may work", detail=told)


def take_slot(book: LimitBook, key: LimitKey, limits: Limits) -> tuple[float, bool | None]:
    """Step 6 without waiting: count the call against the run, take a concurrency slot if one is free.

    Returns the call's deadline (the loop's clock: asyncio and uvloop both count CLOCK_MONOTONIC) and
    whether a slot was taken (None: all are taken, wait for one).
    """
    book.count_call(key, limits.maxCallsPerRun)
    deadline = time.monotonic() + (limits.timeoutSeconds or DEFAULT_TIMEOUT_SECONDS)
    return deadline, book.try_acquire(key, limits.maxConcurrent)


async def wait_for_slot(book: LimitBook, key: LimitKey, limits: Limits, deadline: float) -> bool:
    """Step 6, waiting: the next free slot of this run, first come first served, before the deadline."""
    try:
        async with asyncio.timeout_at(deadline):
            return await book.acquire(key, limits.maxConcurrent)
    except TimeoutError:
        raise concurrency_error(limits.maxConcurrent or 0, limits.timeoutSeconds or DEFAULT_TIMEOUT_SECONDS) from None


async def prepare(supervisor: Supervisor, snapshot: Snapshot, plan: ToolPlan, arguments: dict[str, Any],
                  files: tuple[FileArg, ...], folder: CallFolder | None,
                  deadline: float) -> tuple[RunningConnector, dict[str, Any], dict[str, str], float]:
    """Step 7 before the call is sent: start the binding's connector process if it is not running, stage its files
    (in the call space of that process's sandbox, `connectors.callspace`, when it has one). The connector, the
    arguments to send it, the connector-side paths to map back and the call's deadline.

    A start is bounded by the connector's own `startSeconds` (the supervisor's), not by the call's time limit, which
    starts again once the process is ready (docs/config.md): a connector loading a model may take longer to start
    than its interface's `timeoutSeconds`."""
    back: dict[str, str] = {}
    connector = supervisor.running()
    if connector is None:
        connector = await supervisor.connector(snapshot, deadline)
        deadline = time.monotonic() + (plan.limits.timeoutSeconds or DEFAULT_TIMEOUT_SECONDS)
    if folder is not None:
        folder.place(supervisor.call_space())  # no await between: the space is the running process's
        async with asyncio.timeout_at(deadline):
            arguments, back = await asyncio.to_thread(folder.stage, files, arguments, plan.limits.maxFileBytes,
                                                      plan.errors)
    return connector, arguments, back, deadline


def map_errors(plan: ToolPlan, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Step 8: the connector's result onto the interface's closed error list (S3); its output."""
    structured = raw.get("structuredContent")
    if raw.get("isError"):
        if isinstance(structured, dict) and isinstance(structured.get("error"), str):
            code = structured["error"]
            message = structured.get("message")
            if code in plan.errors:
                raise ToolError(code, cut_message(message) if isinstance(message, str) else code,
                                retry=reported_retry(raw))
            raise unavailable("undeclared_error", f"the service failed with '{code[:100]}', which "
                              f"{plan.interface} does not declare; retrying later may work")
        raise unavailable("connector_error", "the service failed without an error code; retrying later may work")
    if not isinstance(structured, dict):
        raise unavailable("output_invalid", "the service returned no structured result",
                          field="/" if structured is None else "(structuredContent)")
    return structured


def reported_retry(raw: Mapping[str, Any]) -> str | None:
    """What a connector said of its own declared error: `later` or `never` in its `_meta["handler/retry"]` (None:
    it said nothing usable, and the code decides)."""
    meta = raw.get("_meta")
    said = meta.get(RETRY) if isinstance(meta, Mapping) else None
    return said if said in (RETRY_LATER, RETRY_NEVER) else None


def validate_output(plan: ToolPlan, structured: Any, record: CallRecord | None = None) -> None:
    """Step 9: the output against the compiled outputSchema, and no deeper than `MOST_OUTPUT_DEPTH`; the log
    names the field, never the value."""
    if plan.compiled.deep_output and nests_deeper(structured, MOST_OUTPUT_DEPTH):  # a schema that sets no bound
        raise unavailable("output_invalid", _NOT_THE_INTERFACE, field=f"(nested deeper than {MOST_OUTPUT_DEPTH} "
                          "levels)")
    validator = plan.compiled.output
    if validator is None or validator.is_valid(structured):
        return
    try:
        error = next(iter(validator.iter_errors(structured)))
    except ValueError:  # the validator's recursion limit: nested deeper than the outputSchema describes
        raise unavailable("output_invalid", _NOT_THE_INTERFACE, field="(nested too deeply)") from None
    field = "/" + "/".join(str(p) for p in error.instance_path)
    kind = error.kind
    if kind.name == "additionalProperties":  # the names are the connector's: the first, cut short, and a count
        extra = kind.as_dict().get("unexpected") or [""]
        field = field.rstrip("/") + "/" + cut_short(str(extra[0]), _SHOWN_NAME)
        field += f" and {len(extra) - 1} more" if len(extra) > 1 else ""
    if record is not None:
        record.keyword = kind.name
    raise unavailable("output_invalid", _NOT_THE_INTERFACE, field=field)


def cut_message(message: str) -> str:
    """A declared error's message as the model reads it: past `MOST_MESSAGE` characters, cut, saying so."""
    if len(message) <= MOST_MESSAGE:
        return message
    return message[:MOST_MESSAGE] + f"… (cut: the service's message was {len(message)} characters long)"


def cut_short(text: str, most: int) -> str:
    """`text`, or its first `most` - 1 characters and an ellipsis when it is longer than `most`."""
    return text if len(text) <= most else text[:most - 1] + "…"


def nests_deeper(value: Any, levels: int) -> bool:
    """Whether `value` nests objects and arrays more than `levels` deep (an object of strings is one level)."""
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return False
    if levels == 0:
        return True
    return any(isinstance(child, dict | list) and nests_deeper(child, levels - 1) for child in children)
