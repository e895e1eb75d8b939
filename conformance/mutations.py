"""Invalid inputs for a tool, derived from its `inputSchema`: each breaks one rule of it.

`invalid_inputs` takes valid base inputs (the smallest one, and the smallest with every optional
property present) and breaks them one rule at a time: a required property dropped, an unknown one
added, a wrong type, a pattern, a length, a range, an enum or an item count broken — plus file paths
the router must refuse by rule S4 (out of the work folder, absolute elsewhere, missing). Each is
checked against the router's validator, so that none is mislabelled: a schema break must fail it,
a file case must pass it.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from conformance.strategies import INPUT_FORMAT, OUTPUT_FORMAT, NoFixturesError, valid_inputs
from reconciler.config.formats import compile_validator

__all__ = ["Mutation", "invalid_inputs"]

_UNKNOWN = "zz_not_in_the_schema"
_MAX_MUTATIONS = 80
_QUICK = settings(database=None, max_examples=300, deadline=None, phases=(Phase.generate, Phase.shrink),
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                         HealthCheck.large_base_example])


@dataclass(frozen=True)
class Mutation:
    """An input the router must refuse: what was broken, and the arguments."""

    label: str
    arguments: dict[str, Any]


def invalid_inputs(schema: Mapping[str, Any], fixtures: Sequence[str]) -> list[Mutation]:
    """Inputs that break `schema` one rule at a time, and file paths S4 refuses; each checked to be refused
    by the router's validator (schema breaks) or to pass it (S4 cases), so none is mislabelled."""
    validator = compile_validator(schema)
    found: dict[str, Mutation] = {}
    for base in _bases(schema, fixtures):
        for where, value, label, is_file in _mutate(schema, base):
            arguments = _replaced(base, where, value)
            if label in found or arguments == base:
                continue
            if validator.is_valid(arguments) != is_file:
                continue  # a break the schema does not see as one, or a file case it already refuses
            found[label] = Mutation(label, arguments)
            if len(found) >= _MAX_MUTATIONS:
                return list(found.values())
    return list(found.values())


def _bases(schema: Mapping[str, Any], fixtures: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Valid inputs to break: the smallest one, and the smallest with every optional property present."""
    for variant in (_all_required(dict(schema)), schema):
        try:
            strategy = valid_inputs(variant, fixtures)
            yield find(strategy, lambda _: True, settings=_QUICK, random=random.Random(0))  # noqa: S311
        except (NoSuchExample, Unsatisfiable, NoFixturesError):
            continue


def _all_required(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every property required and every array non-empty, so a base input holds them all."""
    out = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and props:
                node["required"] = sorted(set(node.get("required", [])) | set(props))
            if node.get("type") == "array" and not node.get("minItems"):
                node["minItems"] = 1
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(out)
    return out


Where = tuple[str | int, ...]


def _mutate(schema: Mapping[str, Any], base: Any) -> Iterator[tuple[Where, Any, str, bool]]:
    """(where, new value, label, is a file case) for each single-rule break of `base`."""

    def resolve(node: Any, depth: int = 0) -> Any:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith("#/") and depth < 20:
            target: Any = schema
            for part in ref[2:].split("/"):
                target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, dict) \
                    else {}
            return resolve(target, depth + 1)
        return node

    def walk(raw: Any, value: Any, where: Where) -> Iterator[tuple[Where, Any, str, bool]]:
        node = resolve(raw)
        if not isinstance(node, dict):
            return
        at = "/" + "/".join(map(str, where))
        if where:
            wrong = _wrong_type(node)
            if wrong is not None:
                yield where, wrong, f"wrong type at {at}: {_type_name(wrong)} where {_wanted(node)}", False
        if "enum" in node and isinstance(value, str):
            yield where, value + "-not-in-enum", f"enum broken at {at}", False
        if isinstance(value, dict):
            yield from _object_breaks(node, value, where, at)
            for name, sub in (node.get("properties") or {}).items():
                if name in value:
                    yield from walk(sub, value[name], (*where, name))
        elif isinstance(value, list):
            yield from _array_breaks(node, value, where, at)
            items = node.get("items")
            if isinstance(items, dict) and value:
                yield from walk(items, value[0], (*where, 0))
        elif isinstance(value, str):
            yield from _string_breaks(node, value, where, at)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield from _number_breaks(node, where, at)

    yield from walk(schema, base, ())


def _object_breaks(node: Mapping[str, Any], value: dict[str, Any], where: Where,
                   at: str) -> Iterator[tuple[Where, Any, str, bool]]:
    for name in node.get("required") or ():
        if name in value:
            yield where, {k: v for k, v in value.items() if k != name}, f"required '{name}' dropped at {at}", False
    if node.get("additionalProperties") is False or node.get("unevaluatedProperties") is False:
        yield where, {**value, _UNKNOWN: 1}, f"unknown property '{_UNKNOWN}' added at {at}", False


def _array_breaks(node: Mapping[str, Any], value: list[Any], where: Where,
                  at: str) -> Iterator[tuple[Where, Any, str, bool]]:
    low, high = node.get("minItems"), node.get("maxItems")
    if isinstance(low, int) and low > 0:
        yield where, value[: low - 1], f"minItems {low} broken at {at}", False
    if isinstance(high, int) and value and high < 1000:
        grown = [copy.deepcopy(value[i % len(value)]) for i in range(high + 1)]
        yield where, grown, f"maxItems {high} broken at {at}", False


def _string_breaks(node: Mapping[str, Any], value: str, where: Where,
                   at: str) -> Iterator[tuple[Where, Any, str, bool]]:
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        for candidate in (value + "!", "!" + value, "", " ", "!", "0", "A" * 3, "€", value.upper(), value * 2):
            try:
                if not re.search(pattern, candidate):
                    yield where, candidate, f"pattern {pattern} broken at {at}", False
                    break
            except re.error:
                break
    low, high = node.get("minLength"), node.get("maxLength")
    if isinstance(low, int) and low > 0:
        yield where, value[: low - 1], f"minLength {low} broken at {at}", False
    if isinstance(high, int) and high < 1_000_000:
        yield where, (value or "x") * (high // max(len(value), 1) + 1) + "x", f"maxLength {high} broken at {at}", False
    fmt = node.get("format")
    if fmt in (INPUT_FORMAT, OUTPUT_FORMAT):
        kind = "file" if fmt == INPUT_FORMAT else "output file"
        yield where, "../" + (value or "outside"), f"{kind} path leading out of the work folder at {at}", True
        yield where, "/etc/passwd", f"absolute {kind} path outside the work folder at {at}", True
        if fmt == INPUT_FORMAT:
            yield where, "no-such-file-in-the-work-folder", f"missing file at {at}", True


def _number_breaks(node: Mapping[str, Any], where: Where, at: str) -> Iterator[tuple[Where, Any, str, bool]]:
    integer = node.get("type") == "integer"
    step = 1 if integer else 0.5
    for keyword, sign, strict in (("minimum", -1, False), ("maximum", 1, False),
                                  ("exclusiveMinimum", -1, True), ("exclusiveMaximum", 1, True)):
        bound = node.get(keyword)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            broken = bound if strict else bound + sign * step
            yield where, int(broken) if integer and float(broken).is_integer() else broken, \
                f"{keyword} {bound} broken at {at}", False


_SAMPLES: tuple[tuple[str, Any], ...] = (
    ("integer", 12345), ("string", "x"), ("boolean", True), ("null", None), ("array", []), ("object", {}),
)


def _wrong_type(node: Mapping[str, Any]) -> Any:
    wanted = node.get("type")
    allowed = {wanted} if isinstance(wanted, str) else set(wanted) if isinstance(wanted, list) else None
    if allowed is None:
        return None
    if "number" in allowed:
        allowed.add("integer")
    for name, sample in _SAMPLES:
        if name not in allowed:
            return sample
    return None


def _wanted(node: Mapping[str, Any]) -> str:
    wanted = node.get("type")
    return f"the schema wants {' or '.join(wanted) if isinstance(wanted, list) else wanted}"


def _type_name(value: Any) -> str:
    return next(name for name, sample in _SAMPLES if type(sample) is type(value))


def _replaced(base: Any, where: Where, value: Any) -> Any:
    if not where:
        return value
    out = copy.deepcopy(base)
    node = out
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    return out


