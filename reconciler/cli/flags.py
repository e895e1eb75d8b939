"""Command-line flags built from a tool's `inputSchema`, for `handler call` (docs/router.md, "handler call").

Each property becomes a flag named in kebab-case (`outputPath` → `--output-path`): strings, integers
and numbers take one value of their type, an `enum` its values as choices, a boolean `--x` /
`--no-x`, and an array of such values repeats its flag. What a flag cannot say — an object, an
array of objects, a value of no single type, or a field whose flag would collide with the command's
own options — is given in `--json`. Required fields are checked once the flags and `--json` are
merged, so either way of giving one counts. A value a call's line cannot carry as given (text that is
not UTF-8, an integer past 64 bits, a number that is not finite) is refused, naming its flag or field:
`carriage_problem` says why. Called by `reconciler.cli.call` and `reconciler.cli.llm`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from reconciler.cli.common import finite_number

__all__ = [
    "FieldFlag",
    "add_field_flags",
    "carriage_problem",
    "carried_integer",
    "carried_number",
    "carried_text",
    "collect_arguments",
    "kebab",
    "plan_flags",
]

_SCALARS = ("string", "integer", "number")
_DEST = "field:"  # argparse dests of the fields, apart from the command's own
# The integers a JSON line written with orjson can hold; one past them made the call fail before it was sent.
_LEAST_INT: Final = -(1 << 63)
_MOST_INT: Final = (1 << 64) - 1
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def carriage_problem(value: Any) -> str | None:
    """Why a call's line cannot carry `value` as given, or None.

    Text must be UTF-8 (a byte that is not, in argv or a C locale's stdin, reaches Python as a lone
    surrogate), an integer must fit in 64 bits, and a number must be finite: JSON has no NaN or infinity, and
    the line would have carried null in its place.
    """
    if isinstance(value, Mapping):
        return next((why for key, item in value.items()
                     if (why := carriage_problem(key) or carriage_problem(item)) is not None), None)
    if isinstance(value, list):
        return next((why for item in value if (why := carriage_problem(item)) is not None), None)
    if isinstance(value, str) and _SURROGATE.search(value):  # the one way a str fails to encode as UTF-8
        return f"{value!r} is not UTF-8 text"
    if isinstance(value, int) and not isinstance(value, bool) and not _LEAST_INT <= value <= _MOST_INT:
        return f"{value} is past the 64-bit integers a call can carry"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    return None


def carried_text(text: str) -> str:
    """`text`, when it is UTF-8 (an argparse type)."""
    if (why := carriage_problem(text)) is not None:
        raise argparse.ArgumentTypeError(why)
    return text


def carried_integer(text: str) -> int:
    """`text` as an integer a call can carry (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if (why := carriage_problem(value)) is not None:
        raise argparse.ArgumentTypeError(why)
    return value


def carried_number(text: str) -> float:
    """`text` as a finite number (an argparse type): `nan` and `inf` would reach the tool as null."""
    return finite_number(text, low=-math.inf, high=math.inf, said="a finite number")


def kebab(name: str) -> str:
    """A field name as a flag word: `outputPath` → `output-path`, `request_id` → `request-id`."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", name).replace("_", "-").lower()


@dataclass(frozen=True, slots=True)
class FieldFlag:
    """One property of the schema: its flag, or why it goes through `--json` (`flag` is None then)."""

    name: str
    flag: str | None
    required: bool
    schema: Mapping[str, Any]
    why_json: str = ""


def plan_flags(schema: Mapping[str, Any], reserved: Iterable[str]) -> list[FieldFlag]:
    """Each property of `schema`, in order, with its flag; `reserved`: the command's own flag words."""
    taken = set(reserved)
    required = set(schema.get("required") or ())
    plans = []
    for name, given in (schema.get("properties") or {}).items():
        prop = _resolved(given, schema)
        if prop.get("type") == "array" and isinstance(prop.get("items"), Mapping):
            prop = {**prop, "items": _resolved(prop["items"], schema)}
        word = kebab(name)
        why = _why_json(prop)
        if not why and word in taken:
            why = f"--{word} is the command's own option"
        plans.append(FieldFlag(name, None if why else word, name in required, prop, why))
        if not why:
            taken.add(word)
    return plans


def add_field_flags(parser: argparse.ArgumentParser, plans: list[FieldFlag]) -> None:
    """Add the flags of `plans` to `parser`; the fields for `--json` are listed in its epilog."""
    group = parser.add_argument_group("the tool's fields")
    for plan in plans:
        if plan.flag is None:
            continue
        help_text = _help(plan)
        kind = _kind(plan.schema)
        if kind == "boolean":
            group.add_argument(f"--{plan.flag}", dest=_DEST + plan.name, action=argparse.BooleanOptionalAction,
                               default=None, help=help_text)
        elif kind == "array":
            convert, choices = _converter(plan.schema.get("items") or {})
            group.add_argument(f"--{plan.flag}", dest=_DEST + plan.name, action="append", type=convert,
                               choices=choices, metavar=_metavar(plan.schema.get("items") or {}),
                               help=help_text + " (repeat the flag for each item)")
        else:
            convert, choices = _converter(plan.schema)
            group.add_argument(f"--{plan.flag}", dest=_DEST + plan.name, type=convert, choices=choices,
                               metavar=_metavar(plan.schema), help=help_text)
    by_json = [p for p in plans if p.flag is None]
    if by_json:
        lines = [f"  {p.name}{' (required)' if p.required else ''}: {p.why_json}" for p in by_json]
        parser.epilog = "give these fields in --json '{...}':\n" + "\n".join(lines)


def collect_arguments(args: argparse.Namespace, plans: list[FieldFlag],
                      given_json: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments: `--json`'s object, then each flag given; ValueError names a clash, a missing field or a
    value in `--json` a call cannot carry (the flags' own values are checked as they are parsed)."""
    for key, value in given_json.items():
        if (why := carriage_problem(key) or carriage_problem(value)) is not None:
            raise ValueError(f"{key!r} in --json: {why}")
    arguments = dict(given_json)
    for plan in plans:
        value = getattr(args, _DEST + plan.name, None)
        if value is None:
            continue
        if plan.name in arguments:
            raise ValueError(f"'{plan.name}' is given both as --{plan.flag} and in --json; give it once")
        arguments[plan.name] = value
    missing = [p for p in plans if p.required and p.name not in arguments]
    if missing:
        said = ", ".join(f"--{p.flag}" if p.flag else f'"{p.name}" in --json' for p in missing)
        raise ValueError(f"missing required field(s): {said}")
    return arguments


def _resolved(schema: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    """`schema`, or what its local `$ref` (`#/$defs/...`) points at in `root`; {} when it points nowhere."""
    for _ in range(32):  # a chain of refs, never a loop
        if not isinstance(schema, Mapping):
            return {}
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, Mapping) else None
        schema = target
    return {}


def _kind(schema: Mapping[str, Any]) -> str | None:
    """The one JSON type a property takes (`null` aside), or 'enum' for a typeless enum, else None."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None and isinstance(schema.get("enum"), list):
        return "enum"
    return kind if isinstance(kind, str) else None


def _why_json(schema: Mapping[str, Any]) -> str:
    """Why a property cannot be a flag, or '' when it can."""
    kind = _kind(schema)
    if kind == "array":
        items = schema.get("items")
        item_kind = _kind(items) if isinstance(items, Mapping) else None
        if item_kind in (*_SCALARS, "enum"):
            return ""
        return "an array of objects" if item_kind == "object" else "an array whose items a flag cannot say"
    if kind in (*_SCALARS, "boolean", "enum"):
        return ""
    return "an object" if kind == "object" else "a value of no single type"


def _converter(schema: Mapping[str, Any]) -> tuple[Callable[[str], Any], list[Any] | None]:
    """How a flag's text becomes the value, and the choices an enum allows."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        if all(isinstance(v, str) for v in enum):
            return str, list(enum)
        by_text = {v if isinstance(v, str) else json.dumps(v): v for v in enum}

        def pick(text: str) -> Any:
            if text not in by_text:
                raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(by_text)})")
            return by_text[text]

        return pick, None
    kind = _kind(schema)
    return {"integer": carried_integer, "number": carried_number}.get(kind or "", carried_text), None


def _metavar(schema: Mapping[str, Any]) -> str | None:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return "{" + ",".join(v if isinstance(v, str) else json.dumps(v) for v in enum) + "}"
    kind = _kind(schema)
    fmt = schema.get("format")
    if fmt in ("handler-file", "handler-output-file"):
        return "PATH"
    return {"integer": "INT", "number": "NUMBER"}.get(kind or "", "TEXT")


def _help(plan: FieldFlag) -> str:
    text = str(plan.schema.get("description") or "").strip()
    fmt = plan.schema.get("format")
    if fmt in ("handler-file", "handler-output-file"):
        text = (text + "; " if text else "") + "a path inside the profile's work folder"
    if plan.required:
        text = (text + " " if text else "") + "(required)"
    return text.replace("%", "%%")
