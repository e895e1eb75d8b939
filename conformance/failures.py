"""The ways a connector fails a check, one type each, and the rules that tell them from a pass.

A generated valid input must give an output valid against the tool's `outputSchema` or an error of
the interface's closed list, and a tool must give an output for at least one of them: one whose
every answer is an allowed error (a wrap calling a tool its server lacks) does nothing. An
`unavailable` that the router made itself (its `_meta` names the cause: the output broke the
schema, the connector crashed, hung, sent an undeclared code or a JSON-RPC error) is a failure,
not an allowed error. Each kind is its own exception type, so that
hypothesis shrinks each distinct bug to its own minimal example rather than merging them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from conformance.replies import Reply
from reconciler.config.formats import format_checker

__all__ = [
    "ConformanceFailure",
    "ConnectorCrashed",
    "ConnectorFailed",
    "ConnectorHung",
    "NeverAnOutput",
    "NotRefused",
    "OutputInvalid",
    "UndeclaredError",
    "UnexpectedRefusal",
    "failures_in",
    "judge_output",
    "show_json",
]


class ConformanceFailure(AssertionError):  # noqa: N818 - a finding about the connector, not an error of ours
    """A connector's answer to `arguments` that breaks the interface; `details` are extra report lines."""

    kind = "failure"

    def __init__(self, summary: str, arguments: Mapping[str, Any], details: Sequence[str] = ()) -> None:
        super().__init__(summary)
        self.summary = summary
        self.arguments = dict(arguments)
        self.details = tuple(details)

    def render(self) -> str:
        lines = [f"{self.kind}: {self.summary}", f"  input:  {show_json(self.arguments)}"]
        lines += [f"  {line}" for line in self.details]
        return "\n".join(lines)


class OutputInvalid(ConformanceFailure):
    kind = "output breaks the outputSchema"


class ConnectorCrashed(ConformanceFailure):
    kind = "connector crashed"


class ConnectorHung(ConformanceFailure):
    kind = "connector exceeded the time limit"


class UndeclaredError(ConformanceFailure):
    kind = "error code outside the closed list"


class ConnectorFailed(ConformanceFailure):
    kind = "connector failed"


class NeverAnOutput(ConformanceFailure):
    kind = "no valid input gave an output"


class UnexpectedRefusal(ConformanceFailure):
    kind = "valid input refused"


class NotRefused(ConformanceFailure):
    kind = "invalid input not refused before the connector"


def judge_output(arguments: Mapping[str, Any], reply: Reply, error_codes: frozenset[str],
                 output_schema: Mapping[str, Any] | None) -> None:
    """Raise the failure `reply` shows for a valid input; return when it is an output or a declared error."""
    if reply.protocol_error is not None:
        raise ConnectorFailed(f"the router answered a valid call with {reply.describe_error()}", arguments,
                              _dispatch_lines(reply))
    if not reply.is_error:
        if output_schema is not None:  # the router validated it; a second look costs little and guards it
            problem = _schema_problem(output_schema, reply.output)
            if problem is not None:
                raise OutputInvalid("the router let through an output that breaks the outputSchema", arguments,
                                    [f"output: {show_json(reply.output)}", *problem])
        return
    cause = reply.cause
    if cause is None:
        if reply.error in error_codes:
            return  # a declared error, said by the connector (or the router's invalid_arguments)
        raise UnexpectedRefusal(f"the call ended with {reply.describe_error()}", arguments, _dispatch_lines(reply))
    raw = reply.connector_output
    if cause.startswith("output"):
        details = [f"router: {reply.message} (cause {cause})"]
        if raw is not None:
            details.append(f"output: {show_json(raw)}")
            if output_schema is not None:
                details.extend(_schema_problem(output_schema, raw) or [])
        raise OutputInvalid("the connector's output breaks the outputSchema", arguments, details)
    if cause == "crashed":
        raise ConnectorCrashed("the connector process died during the call", arguments, _dispatch_lines(reply))
    if cause in ("timeout", "no_reply"):
        raise ConnectorHung(f"no result within the time limit ({reply.seconds:.1f} s): {reply.message}", arguments)
    if cause == "undeclared_error":
        raise UndeclaredError(reply.message, arguments, _dispatch_lines(reply))
    raise ConnectorFailed(f"{reply.describe_error()}", arguments, _dispatch_lines(reply))


def failures_in(exc: BaseException) -> Iterator[ConformanceFailure]:
    """The conformance failures in `exc`: itself, or the leaves of an exception group (hypothesis
    raises one when it found several distinct bugs)."""
    if isinstance(exc, ConformanceFailure):
        yield exc
    elif isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from failures_in(inner)


def _schema_problem(schema: Mapping[str, Any], instance: Any) -> list[str] | None:
    """Where `instance` breaks `schema`: the instance path and the schema path of the clearest error."""
    error = best_match(Draft202012Validator(schema, format_checker=format_checker()).iter_errors(instance))
    if error is None:
        return None
    at = "/" + "/".join(str(p) for p in error.absolute_path)
    rule = "/" + "/".join(str(p) for p in error.absolute_schema_path)
    return [f"breaks: at {at}: {error.message}", f"schema: {rule}"]


def _dispatch_lines(reply: Reply) -> list[str]:
    lines = [f"router: {reply.describe_error()}"]
    for dispatch in reply.dispatched:
        if dispatch.failure is not None:
            lines.append(f"connector: {dispatch.failure}")
        elif dispatch.result is not None:
            lines.append(f"connector answered: {show_json(dispatch.result.get('structuredContent'))}")
    return lines


def show_json(value: Any, limit: int = 2000) -> str:
    """JSON for a person: readable accents, but every invisible character escaped (a minimal example
    is often one control character)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    text = "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
