"""Judging a case's result: the assertions of docs/conformance.md evaluated on a tool's output.

The grammar is parsed by `reconciler.config.cases` (a save-time check reports a malformed case);
this module only evaluates a parsed `Case` against what the router answered. Every failed
assertion is reported, not the first, each naming the path, what was expected and what was there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from conformance.replies import Reply
from reconciler.config.cases import Assertion, Case

__all__ = ["check_assertion", "cosine", "evaluate_case", "measured_rates", "resolve_path", "spoken_files", "strings_in",
           "word_error_rate", "words_of"]

_MISSING = object()


def evaluate_case(case: Case, reply: Reply, heard: Mapping[str, str] | None = None) -> list[str]:
    """What is wrong with `reply` for `case`, one line each; empty when the case passes. `heard` holds the
    transcript of each audio file a `spokenWordErrorRate` names (see `spoken_files`)."""
    if case.error is not None:
        if not reply.is_error:
            return [f"expected the error '{case.error}', but the call succeeded with {_short(reply.output)}"]
        if reply.error != case.error:
            return [f"expected the error '{case.error}', got {reply.describe_error()}"]
        return []
    if reply.is_error:
        return [f"expected an output, got {reply.describe_error()}"]
    output = reply.output
    problems: list[str] = []
    texts = list(strings_in(output))
    for needle in case.contains:
        if not any(needle in text for text in texts):
            problems.append(f"contains: no string of the output contains {needle!r}")
    for assertion in case.assertions:
        problems.extend(check_assertion(assertion, output, heard))
    return problems


def spoken_files(case: Case, output: Any) -> list[tuple[str, str]]:
    """(transcriber interface version, audio file path) for each place a `spokenWordErrorRate` names."""
    return [(a.value["transcriber"], value) for a in case.assertions if a.op == "spokenWordErrorRate"
            for _, value in resolve_path(output, a.path) if isinstance(value, str)]


def measured_rates(case: Case, output: Any, heard: Mapping[str, str] | None = None) -> dict[str, float]:
    """The word error rate each `wordErrorRate` or `spokenWordErrorRate` measured, by its place: the figure
    the listing shows beside the tier (a spoken one is the round trip, speech heard back)."""
    rates: dict[str, float] = {}
    for a in case.assertions:
        if a.op not in ("wordErrorRate", "spokenWordErrorRate"):
            continue
        for where, value in resolve_path(output, a.path):
            text = (heard or {}).get(value) if a.op == "spokenWordErrorRate" and isinstance(value, str) else value
            if isinstance(text, str):
                rates[f"{where}.{a.op}"] = round(word_error_rate(text, a.value["reference"])[0], 4)
    return rates


def strings_in(value: Any) -> Iterator[str]:
    """Every string value anywhere in `value` (object keys are not values)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def resolve_path(value: Any, path: tuple[str | int, ...], where: str = "") -> Iterator[tuple[str, Any]]:
    """(concrete path, value) for each place `path` names; `*` fans out over an array's items.

    A place that does not exist yields the sentinel `_MISSING`, so `exists = false` can hold.
    """
    if not path:
        yield where or "(output)", value
        return
    head, rest = path[0], path[1:]
    if head == "*":
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from resolve_path(item, rest, _join(where, index))
        else:
            yield _join(where, "*"), _MISSING
        return
    if isinstance(head, int) and isinstance(value, list):
        found = value[head] if -len(value) <= head < len(value) else _MISSING
    elif isinstance(value, dict):
        found = value.get(str(head), _MISSING)
    else:
        found = _MISSING
    if found is _MISSING:
        yield _join(where, head), _MISSING
        return
    yield from resolve_path(found, rest, _join(where, head))


def check_assertion(assertion: Assertion, output: Any, heard: Mapping[str, str] | None = None) -> list[str]:
    """The failures of one assertion; `*` segments must hold for every item."""
    problems = []
    for where, value in resolve_path(output, assertion.path):
        if assertion.op == "spokenWordErrorRate":
            problem = _spoken_problem(assertion.value, value, heard or {})
        else:
            problem = _check_one(assertion.op, assertion.value, value)
        if problem is not None:
            problems.append(f"{where}.{assertion.op} = {assertion.value!r}: {problem}")
    return problems


def _check_one(op: str, expected: Any, value: Any) -> str | None:
    if op == "exists":
        present = value is not _MISSING
        if present == bool(expected):
            return None
        return "the path is absent" if expected else f"the path is present ({_short(value)})"
    if value is _MISSING:
        return "the path is absent"
    if op in ("minItems", "maxItems"):
        if not isinstance(value, list):
            return f"expected an array, got {_kind(value)}"
        return _bound(op == "minItems", len(value), expected, "items")
    if op in ("minLength", "maxLength"):
        if not isinstance(value, str):
            return f"expected a string, got {_kind(value)}"
        return _bound(op == "minLength", len(value), expected, "characters")
    if op in ("minimum", "maximum"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {_kind(value)}"
        return _bound(op == "minimum", value, expected, "")
    if op == "equals":
        return None if value == expected else f"the value is {_short(value)}"
    if op == "matches":
        if not isinstance(value, str):
            return f"expected a string, got {_kind(value)}"
        return None if re.search(str(expected), value) else f"{_short(value)} does not match"
    if op == "contains":
        if isinstance(value, str):
            return None if str(expected) in value else f"{_short(value)} does not contain it"
        if isinstance(value, list):
            return None if expected in value else f"the array ({len(value)} items) does not hold it"
        return f"expected a string or an array, got {_kind(value)}"
    if op == "wordErrorRate":
        if not isinstance(value, str):
            return f"expected a string, got {_kind(value)}"
        return _word_error_problem(value, expected["reference"], expected["maximum"])
    if op == "nearerByCosine":
        return _nearer_problem(value, expected)
    return f"unknown assertion '{op}'"  # the parser admits only the known ones


def words_of(text: str) -> list[str]:
    """The words of a transcript as a word error rate counts them: lower case, without punctuation."""
    return re.findall(r"[a-z0-9]+(?:'[a-z0-9]+)*", text.lower())


def word_error_rate(hypothesis: str, reference: str) -> tuple[float, int]:
    """(the word error rate, the errors): substitutions, deletions and insertions, the fewest that turn the
    reference's words into the hypothesis's, over the reference's word count."""
    said, heard = words_of(reference), words_of(hypothesis)
    previous = list(range(len(heard) + 1))
    for i, word in enumerate(said, 1):
        current = [i]
        for j, other in enumerate(heard, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    errors = previous[-1]
    return errors / max(len(said), 1), errors


def _word_error_problem(value: str, reference: str, maximum: float) -> str | None:
    rate, errors = word_error_rate(value, reference)
    if rate <= maximum:
        return None
    return (f"the word error rate is {rate:.2f} ({errors} errors in {len(words_of(reference))} words), over "
            f"{maximum}: heard {_short(value)}")


def _spoken_problem(expected: Mapping[str, Any], value: Any, heard: Mapping[str, str]) -> str | None:
    """The word error bound on the transcript of the audio file `value` names, heard by the transcriber."""
    if value is _MISSING:
        return "the path is absent"
    if not isinstance(value, str):
        return f"expected the path of an audio file, got {_kind(value)}"
    transcript = heard.get(value)
    if transcript is None:
        return f"{_short(value)} was not heard back by {expected['transcriber']} (see the case's other problems)"
    problem = _word_error_problem(transcript, expected["reference"], expected["maximum"])
    return None if problem is None else f"heard back by {expected['transcriber']}: {problem}"


def cosine(a: list[float], b: list[float]) -> float:
    """The cosine similarity of two vectors of the same length (0 when either is all zeros)."""
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norms if norms else 0.0


def _nearer_problem(value: Any, expected: dict[str, Any]) -> str | None:
    """Why item `near` is not nearer to item `anchor` than item `far` is, by cosine similarity (by `margin`)."""
    anchor, near, far = expected["anchor"], expected["near"], expected["far"]
    if not isinstance(value, list) or max(anchor, near, far) >= len(value):
        return f"expected an array of at least {max(anchor, near, far) + 1} vectors, got {_kind(value)}"
    vectors = [value[anchor], value[near], value[far]]
    if not all(isinstance(v, list) and v and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
               for v in vectors) or len({len(v) for v in vectors}) != 1:
        return "items anchor, near and far must be vectors of numbers of one length"
    close, distant = cosine(vectors[0], vectors[1]), cosine(vectors[0], vectors[2])
    margin = expected.get("margin", 0)
    if close > distant + margin:
        return None
    return (f"item {near} is not nearer to item {anchor} than item {far}"
            f"{f' by {margin}' if margin else ''}: cosine similarity {close:.3f} against {distant:.3f}")


def _bound(is_min: bool, actual: float, limit: Any, unit: str) -> str | None:
    ok = actual >= limit if is_min else actual <= limit
    if ok:
        return None
    shown = f"{actual} {unit}".strip()
    return f"it has {shown}" if unit else f"the value is {actual}"


def _join(where: str, segment: str | int) -> str:
    return f"{where}.{segment}" if where else str(segment)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {_short(value)}"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
