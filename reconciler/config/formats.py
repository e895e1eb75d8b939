"""A tool's schema compiled into the validator calls are checked with, `format` included (docs/router.md "Formats").

A value passes a `format` only when JSON Schema's own check (jsonschema-rs) accepts it AND ajv-formats
in its full mode would: most MCP hosts run on the TypeScript SDK, which validates a result's
`structuredContent` with Ajv and ajv-formats and throws on a value they refuse, so the router refuses
it first: a bad input is `invalid_arguments`, a bad output `unavailable` (`output_invalid`). The
ajv-formats rules below are its full-mode rules, rewritten for Python's `re` (ASCII-only, matched
whole, since Python's `$` also matches before a final newline). Other formats jsonschema-rs knows
are checked its way; formats it does not know (`handler-file`, ...) are left to their own steps.

The router's validators (`router/generation.py`) and the conformance runner's (which must draw only
inputs the router accepts) are compiled here, so both see one rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import jsonschema_rs
from jsonschema import FormatChecker

__all__ = ["CHECKED_FORMATS", "compile_validator", "format_accepts", "format_checker"]

_FLAGS = re.ASCII | re.IGNORECASE

# ajv-formats 3 full mode, rule for rule.
_EMAIL = re.compile(r"[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
                    r"@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]*[a-z0-9])?", _FLAGS)
_HOSTNAME = re.compile(r"(?=.{1,253}\.?\Z)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                       r"(?:\.[a-z0-9](?:[-0-9a-z]{0,61}[0-9a-z])?)*\.?", _FLAGS)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}", re.ASCII)
_H16 = "[0-9a-f]{1,4}"
_V4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_IPV6 = re.compile(
    rf"(?:(?:{_H16}:){{7}}(?:{_H16}|:))"
    rf"|(?:(?:{_H16}:){{6}}(?::{_H16}|{_V4}|:))"
    rf"|(?:(?:{_H16}:){{5}}(?:(?::{_H16}){{1,2}}|:{_V4}|:))"
    rf"|(?:(?:{_H16}:){{4}}(?:(?::{_H16}){{1,3}}|(?::{_H16})?:{_V4}|:))"
    rf"|(?:(?:{_H16}:){{3}}(?:(?::{_H16}){{1,4}}|(?::{_H16}){{0,2}}:{_V4}|:))"
    rf"|(?:(?:{_H16}:){{2}}(?:(?::{_H16}){{1,5}}|(?::{_H16}){{0,3}}:{_V4}|:))"
    rf"|(?:(?:{_H16}:){{1}}(?:(?::{_H16}){{1,6}}|(?::{_H16}){{0,4}}:{_V4}|:))"
    rf"|(?::(?:(?::{_H16}){{1,7}}|(?::{_H16}){{0,5}}:{_V4}|:))", _FLAGS)
_UUID = re.compile(r"(?:urn:uuid:)?[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}", _FLAGS)
_DATE = re.compile(r"(\d\d\d\d)-(\d\d)-(\d\d)", re.ASCII)
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d(?:\.\d+)?)(z|([+-])(\d\d)(?::?(\d\d))?)?", _FLAGS)
_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# RFC 3986's URI and URI-reference as ajv-formats spells them (after jmrware's URI regex).
_IP_LITERAL = (
    r"\[(?:(?:(?:(?:[0-9a-f]{1,4}:){6}|::(?:[0-9a-f]{1,4}:){5}|(?:[0-9a-f]{1,4})?::(?:[0-9a-f]{1,4}:){4}"
    r"|(?:(?:[0-9a-f]{1,4}:){0,1}[0-9a-f]{1,4})?::(?:[0-9a-f]{1,4}:){3}"
    r"|(?:(?:[0-9a-f]{1,4}:){0,2}[0-9a-f]{1,4})?::(?:[0-9a-f]{1,4}:){2}"
    r"|(?:(?:[0-9a-f]{1,4}:){0,3}[0-9a-f]{1,4})?::[0-9a-f]{1,4}:|(?:(?:[0-9a-f]{1,4}:){0,4}[0-9a-f]{1,4})?::)"
    r"(?:[0-9a-f]{1,4}:[0-9a-f]{1,4}|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?))"
    r"|(?:(?:[0-9a-f]{1,4}:){0,5}[0-9a-f]{1,4})?::[0-9a-f]{1,4}|(?:(?:[0-9a-f]{1,4}:){0,6}[0-9a-f]{1,4})?::)"
    r"|[Vv][0-9a-f]+\.[a-z0-9\-._~!$&'()*+,;=:]+)\]")
_DOTTED = r"(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?)"
_PCT = r"%[0-9a-f]{2}"


def _uri_pattern(extra: str, scheme_optional: bool) -> str:
    """ajv-formats' `uri` (extra = "") and `uri-reference` (extra = '"': it also lets a quote through)."""
    sub = f"[a-z0-9\\-._~!$&'(){extra}*+,;=]"
    pchar = f"(?:[a-z0-9\\-._~!$&'(){extra}*+,;=:@]|{_PCT})"
    authority = (rf"\/?\/(?:(?:[a-z0-9\-._~!$&'()*+,;=:]|{_PCT})*@)?(?:{_IP_LITERAL}|{_DOTTED}|(?:{sub}|{_PCT})*)"
                 rf"(?::\d*)?(?:\/{pchar}*)*")
    path = rf"\/(?:{pchar}+(?:\/{pchar}*)*)?|{pchar}+(?:\/{pchar}*)*"
    scheme = r"(?:[a-z][a-z0-9+\-.]*:)" + ("?" if scheme_optional else "")
    hier = f"(?:{authority}|{path})" + ("?" if scheme_optional else "")
    after = rf"(?:[a-z0-9\-._~!$&'(){extra}*+,;=:@/?]|{_PCT})*"
    tail = rf"(?:\?{after})?(?:#{after})?"
    return scheme + hier + tail


_URI = re.compile(_uri_pattern("", scheme_optional=False), _FLAGS)
_URI_REFERENCE = re.compile(_uri_pattern('"', scheme_optional=True), _FLAGS)
_NOT_URI_FRAGMENT = re.compile(r"[/:]")


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _ajv_date(value: str) -> bool:
    found = _DATE.fullmatch(value)
    if found is None:
        return False
    year, month, day = (int(g) for g in found.groups())
    return 1 <= month <= 12 and 1 <= day <= (29 if month == 2 and _is_leap(year) else _DAYS[month])


def _ajv_time(value: str) -> bool:
    """A time with its zone (full mode's strict zone); 23:59:60 only when it is a leap second in UTC."""
    found = _TIME.fullmatch(value)
    if found is None or not found.group(4):
        return False
    hour, minute, second = int(found.group(1)), int(found.group(2)), float(found.group(3))
    sign = -1 if found.group(5) == "-" else 1
    zone_hour, zone_minute = int(found.group(6) or 0), int(found.group(7) or 0)
    if zone_hour > 23 or zone_minute > 59:
        return False
    if hour <= 23 and minute <= 59 and second < 60:
        return True
    utc_minute = minute - zone_minute * sign
    utc_hour = hour - zone_hour * sign - (1 if utc_minute < 0 else 0)
    return utc_hour in (23, -1) and utc_minute in (59, -1) and second < 61


def _ajv_date_time(value: str) -> bool:
    parts = re.split(r"[tT\s]", value)
    return len(parts) == 2 and _ajv_date(parts[0]) and _ajv_time(parts[1])


_AJV_FULL: Final[Mapping[str, Callable[[str], bool]]] = {
    "email": lambda v: _EMAIL.fullmatch(v) is not None,
    "hostname": lambda v: _HOSTNAME.fullmatch(v) is not None,
    "ipv4": lambda v: _IPV4.fullmatch(v) is not None,
    "ipv6": lambda v: _IPV6.fullmatch(v) is not None,
    "uuid": lambda v: _UUID.fullmatch(v) is not None,
    "uri": lambda v: _NOT_URI_FRAGMENT.search(v) is not None and _URI.fullmatch(v) is not None,
    "uri-reference": lambda v: _URI_REFERENCE.fullmatch(v) is not None,
    "date": _ajv_date,
    "time": _ajv_time,
    "date-time": _ajv_date_time,
}

CHECKED_FORMATS: Final = tuple(_AJV_FULL)


def _both(name: str) -> Callable[[str], bool]:
    own = jsonschema_rs.validator_for({"type": "string", "format": name}, validate_formats=True)
    ajv = _AJV_FULL[name]
    return lambda value: ajv(value) and own.is_valid(value)


_FORMATS: Final = {name: _both(name) for name in CHECKED_FORMATS}


def format_accepts(name: str, value: str) -> bool:
    """Whether the router accepts `value` for `format: name` (True for a format it does not check)."""
    check = _FORMATS.get(name)
    return True if check is None else check(value)


def compile_validator(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """`schema` compiled with its formats checked; offline: a `$ref` never reaches the network (S2 makes
    every schema self-contained anyway)."""
    return jsonschema_rs.validator_for(dict(schema), offline=True, validate_formats=True, formats=_FORMATS)


def format_checker() -> FormatChecker:
    """The same format rules for the `jsonschema` library, which explains a failure where jsonschema-rs judged it."""
    checker = FormatChecker(formats=())
    for name in CHECKED_FORMATS:
        checker.checks(name)(lambda value, name=name: not isinstance(value, str) or format_accepts(name, value))
    return checker
