"""Fuzzing a tool through the router: generated valid inputs judged, derived invalid ones refused.

`fuzz_tool` calls the tool with valid inputs (`strategies.valid_inputs`) and judges each result
(`failures.judge_output`): an output valid against the outputSchema, or an error of the closed list;
and a tool whose every result was an error fails (`NeverAnOutput`), since errors alone prove nothing.
hypothesis shrinks a failure to a minimal input, reproducible with the run's seed. `refuse_invalid`
sends the inputs `mutations.invalid_inputs` derives, each of which must be refused with
`invalid_arguments` before the connector sees it.

hypothesis-jsonschema covers drafts 4 to 7: `unhonoured_keywords` names the 2020-12 keywords of a
schema it cannot honour, for the report (never a silent skip).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from conformance.failures import NeverAnOutput, NotRefused, judge_output
from conformance.mutations import Mutation, invalid_inputs
from conformance.replies import Reply
from conformance.strategies import OUTPUT_FOLDER, NoFixturesError, valid_inputs
from reconciler.config.models import Tool
from reconciler.config.schemas import NEW_KEYWORDS, iter_subschemas

__all__ = [
    "OUTPUT_FOLDER",
    "FuzzStats",
    "Mutation",
    "NoFixturesError",
    "fuzz_settings",
    "fuzz_tool",
    "invalid_inputs",
    "refuse_invalid",
    "unhonoured_keywords",
    "valid_inputs",
]

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
               HealthCheck.large_base_example]

Call = Callable[[Mapping[str, Any]], Reply]


def fuzz_settings(examples: int) -> settings:
    """How a fuzz run goes: `examples` inputs, no deadline (calls are slow), no example database
    (a run is reproduced by its seed), and shrinking on."""
    return settings(max_examples=examples, deadline=None, database=None, print_blob=False,
                    phases=(Phase.generate, Phase.shrink), suppress_health_check=_SUPPRESSED)


def unhonoured_keywords(schema: Mapping[str, Any]) -> list[str]:
    """The 2020-12 keywords of `schema` that hypothesis-jsonschema (drafts 4-7) ignores, with where."""
    found = []
    for path, sub in iter_subschemas(dict(schema)):
        for keyword in sorted(NEW_KEYWORDS.intersection(sub)):
            found.append(f"'{keyword}' at /{'/'.join(map(str, path))}")
    return found


@dataclass
class FuzzStats:
    """What a fuzz run did: examples run and how they ended (an error code, or `output`)."""

    examples: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


def fuzz_tool(call: Call, tool: Tool, fixtures: Sequence[str], error_codes: frozenset[str], *,
              examples: int, seed: int, stats: FuzzStats | None = None, addresses: Sequence[str] = ()) -> FuzzStats:
    """Call `tool` with generated valid inputs (`addresses`: URLs to draw half the `format: uri` values
    from); raises the (shrunk) failure, else returns the stats (kept in `stats`, when given, also when
    it raises)."""
    stats = stats if stats is not None else FuzzStats()
    output_schema = tool.outputSchema
    first: list[dict[str, Any]] = []

    @fuzz_settings(examples)
    @hypothesis_seed(seed)
    @given(valid_inputs(tool.inputSchema, fixtures, addresses))
    def one_input(arguments: dict[str, Any]) -> None:
        reply = call(arguments)
        stats.examples += 1
        stats.outcomes[reply.error or "output"] += 1
        first[:] = first or [arguments]
        judge_output(arguments, reply, error_codes, output_schema)

    one_input()
    if stats.examples and not stats.outcomes["output"]:
        ended = ", ".join(f"{code} {n}x" for code, n in sorted(stats.outcomes.items()))
        raise NeverAnOutput(f"all {stats.examples} valid inputs ended in an error ({ended}): the tool never "
                            "gave an output", first[0] if first else {})
    return stats


def refuse_invalid(call: Call, mutations: Sequence[Mutation]) -> int:
    """Send each mutation; raise `NotRefused` listing every one the router did not refuse up front."""
    problems: list[str] = []
    first: Mutation | None = None
    for mutation in mutations:
        reply = call(mutation.arguments)
        problem = None
        if not reply.is_error:
            problem = "the call succeeded"
        elif reply.error != "invalid_arguments":
            problem = f"it ended with {reply.describe_error()}"
        elif reply.dispatched:
            problem = "it was refused, but only after it reached the connector"
        if problem is not None:
            first = first or mutation
            problems.append(f"{mutation.label}: {problem}")
    if first is not None:
        raise NotRefused(f"{len(problems)} of {len(mutations)} invalid inputs were not refused with "
                         "invalid_arguments before the connector", first.arguments, problems)
    return len(mutations)
