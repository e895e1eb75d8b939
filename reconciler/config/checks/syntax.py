"""What one file shows on its own, first: is it TOML or JSON (F001), and is it the kind it should be,
with the keys and types its model defines (F002, F004)?

The loader reads every file through `parse_document` and builds its model with `validate_model`;
errors become findings at the line they are on, never tracebacks.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from reconciler.config.documents import Document
from reconciler.config.findings import Finding, suggest
from reconciler.config.models import ENV_NAME, REFERENCE_FORMS

__all__ = ["model_findings", "parse_document", "secret_example", "validate_model"]

M = TypeVar("M", bound=BaseModel)

_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


def parse_document(path: str, sha: str, data: bytes) -> tuple[Document | None, Any, Finding | None]:
    """Decode and parse a TOML or JSON file; a failure is one F001 finding at its line."""
    fmt: Literal["toml", "json"] = "json" if path.endswith(".json") else "toml"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, None, _not_utf8(path, exc)
    doc = Document(path, sha, text, fmt)
    try:
        value = tomllib.loads(text) if fmt == "toml" else orjson.loads(data)
    except tomllib.TOMLDecodeError as exc:
        return doc, None, _invalid_toml(path, text, exc)
    except orjson.JSONDecodeError as exc:
        return doc, None, _invalid_json(path, exc)
    except RecursionError:  # tomllib parses nested arrays and inline tables by recursion; orjson stops at 1024
        return doc, None, Finding("F001", path, 1, "invalid TOML: arrays or inline tables nested too deeply to read",
                                  "a TOML document nested a few levels deep, as every file of a config tree is",
                                  "remove the nesting (no field of a config file takes values nested this deep)")
    return doc, value, None


def _not_utf8(path: str, exc: UnicodeDecodeError) -> Finding:
    return Finding(
        "F001",
        path,
        1,
        f"the file is not UTF-8 text (byte {exc.start})",
        "UTF-8 encoded text",
        "save the file as UTF-8",
    )


def _invalid_toml(path: str, text: str, exc: tomllib.TOMLDecodeError) -> Finding:
    match = _TOML_POSITION.search(str(exc))
    # Without a line, tomllib says "at end of document": a string, array or table was left open, and what was
    # written last (blank lines aside) is the nearest a line can point.
    return Finding(
        "F001",
        path,
        int(match.group(1)) if match else text.rstrip().count("\n") + 1,
        f"invalid TOML: {_TOML_POSITION.sub('', str(exc)).strip()}",
        "a valid TOML document",
        "fix the syntax on that line (quotes, brackets, '=' between key and value)",
    )


def _invalid_json(path: str, exc: orjson.JSONDecodeError) -> Finding:
    return Finding(
        "F001",
        path,
        exc.lineno,
        f"invalid JSON: {exc.msg} (column {exc.colno})",
        "a valid JSON document",
        "fix the syntax on that line (commas, quotes, brackets)",
    )


def validate_model(doc: Document, value: Any, model: type[M], api_version: str) -> tuple[M | None, list[Finding]]:
    """Build `model` from parsed data; every model error becomes a finding at its key's line."""
    if not isinstance(value, dict) or value.get("apiVersion") != api_version:
        got = value.get("apiVersion") if isinstance(value, dict) else None
        what = f"apiVersion is {got!r}" if got is not None else "apiVersion is missing"
        return None, [
            Finding(
                "F002",
                doc.path,
                doc.line_of("apiVersion"),
                f"{what}; this file must be a {api_version}",
                f'apiVersion = "{api_version}"',
                f'put apiVersion = "{api_version}" at the top of the file',
            )
        ]
    try:
        return model.model_validate(value), []
    except ValidationError as exc:
        known = _field_names(model)
        return None, model_findings(doc, value, exc.errors(), known)


def model_findings(doc: Document, value: Any, errors: Sequence[Any], known: set[str]) -> list[Finding]:
    """The F004 findings for pydantic's `errors` in `value`, the data as parsed; `known` are the field names a
    misspelt key is matched to. A value that fits none of the types a key takes is one finding naming them all
    (pydantic reports one error per type tried)."""
    findings: list[Finding] = []
    invalid: dict[tuple[str | int, ...], list[Any]] = {}
    for err in errors:
        loc = _written_path(value, err["loc"], err["type"])
        if err["type"] in ("secret_reference", "extra_forbidden", "missing"):
            findings.append(_named_finding(doc, loc, err, known))
        else:
            invalid.setdefault(loc, []).append(err)
    findings.extend(_invalid_finding(doc, loc, errs) for loc, errs in invalid.items())
    return findings


def _named_finding(doc: Document, loc: tuple[str | int, ...], err: Any, known: set[str]) -> Finding:
    kind = err["type"]
    where = ".".join(str(p) for p in loc) or "the file"
    line = doc.line_of(*loc)
    if kind == "secret_reference" and loc:  # `models.SecretRef`'s own: what is wrong, never what was written
        slot = str(loc[-1])
        return Finding("F004", doc.path, line, f"secret slot '{slot}': {err['msg']}", REFERENCE_FORMS,
                       secret_example(slot, err["ctx"]["form"]))
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else ""
        return Finding(
            "F004",
            doc.path,
            line,
            f"unknown key '{where}'{suggest(key, known).did_you_mean}",
            "only the keys this kind of file defines (see docs/config.md)",
            f"remove '{key}' or correct its spelling",
        )
    return Finding(
        "F004",
        doc.path,
        line,
        f"'{where}' is required but missing",
        f"a value for '{where}'",
        f"add {loc[-1] if loc else 'it'} = ... to the file",
    )


def _invalid_finding(doc: Document, loc: tuple[str | int, ...], errs: Sequence[Any]) -> Finding:
    """One value that is not what its key takes: each type or rule it failed, in plain words."""
    where = ".".join(str(p) for p in loc) or "the file"
    given = errs[0].get("input")
    shown = repr(given) if isinstance(given, str | int | float | bool) else _TOML_KINDS.get(type(given), "a value")
    wanted = list(dict.fromkeys(_plain(err["msg"]) for err in errs))
    said = wanted[0] if len(wanted) == 1 else "it should be one of: " + "; ".join(
        w.removeprefix("Input should be ") for w in wanted)
    expected = _expected_from(errs[0]) if len(errs) == 1 else "; ".join(
        w.removeprefix("Input should be ") for w in wanted)
    return Finding("F004", doc.path, doc.line_of(*loc), f"'{where}' is invalid: {said} (given {shown})", expected,
                   f"correct the value of '{where}'")


_TOML_KINDS: dict[type, str] = {dict: "a table", list: "an array"}


def _plain(msg: str) -> str:
    """pydantic's message without its own prefix for a validator's error."""
    return str(msg).removeprefix("Value error, ")


def secret_example(slot: str, form: str) -> str:
    """A reference of `form` (command, env or file) for `slot`, as a binding's secrets table writes it."""
    if form == "command":
        return f'{slot} = {{ command = ["pass", "show", "{slot}"] }}'
    if form == "file":
        return f'{slot} = {{ file = "/run/secrets/{slot}" }}'
    name = re.sub(r"[^A-Za-z0-9_]", "_", slot).upper()
    return f'{slot} = {{ env = "{name if ENV_NAME.fullmatch(name) else "_" + name}" }}'


def _written_path(value: Any, loc: tuple[str | int, ...], kind: str) -> tuple[str | int, ...]:
    """The keys and indexes of `loc` that lead through `value`, as the file writes them. The others name the
    members of a union ('str', 'WrapTool', 'function-after[...]') or a dict's '[key]': pydantic's, never the
    file's. A missing key is not in the file, but it is what the error is about: it is kept."""
    path: list[str | int] = []
    for i, part in enumerate(loc):
        if isinstance(value, dict) and part in value:  # noqa: SIM114 - apart, mypy narrows `part` to int below
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]
        elif not (kind == "missing" and i == len(loc) - 1):
            continue
        path.append(part)
    return tuple(path)


def _expected_from(err: Any) -> str:
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        return f"one of {ctx['expected']}"
    return str(err["msg"]).removeprefix("Value error, ")


def _field_names(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """Every field name of `model` and the models nested in it, for 'did you mean'."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for field in model.model_fields.values():
        for arg in _types_in(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                names |= _field_names(arg, seen)
    return names


def _types_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    out: list[Any] = []
    for arg in args:
        out.extend(_types_in(arg))
    return out
