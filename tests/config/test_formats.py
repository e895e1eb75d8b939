"""`format` as the router checks it: what ajv-formats (full mode) refuses and what the format's RFC refuses."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from reconciler.config.formats import CHECKED_FORMATS, compile_validator, format_accepts, format_checker
from tests.fixtures import format_cases


def test_the_case_table_covers_every_checked_format() -> None:
    assert set(format_cases.GOOD) == set(format_cases.AJV_REFUSES) == set(CHECKED_FORMATS)


@pytest.mark.parametrize(("name", "value"), [(f, v) for f, vs in format_cases.GOOD.items() for v in vs])
def test_a_good_value_passes(name: str, value: str) -> None:
    assert format_accepts(name, value)
    assert compile_validator({"type": "string", "format": name}).is_valid(value)


@pytest.mark.parametrize(("name", "value"), format_cases.refused())
def test_a_bad_value_is_refused_by_both_validators(name: str, value: str) -> None:
    assert not format_accepts(name, value)
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": name}}}
    errors = list(compile_validator(schema).iter_errors({"v": value}))
    assert [(e.kind.name, list(e.instance_path)) for e in errors] == [("format", ["v"])]
    # the conformance runner explains a failure with the jsonschema library: it must see the same break
    explained = list(Draft202012Validator(schema, format_checker=format_checker()).iter_errors({"v": value}))
    assert [e.validator for e in explained] == ["format"]


def test_formats_apply_to_strings_only_and_unknown_formats_are_left_alone() -> None:
    validator = compile_validator({"type": "object", "properties": {
        "n": {"format": "email"}, "f": {"type": "string", "format": "handler-file"}}})
    assert validator.is_valid({"n": 3, "f": "../anything"})  # handler-file is the files step's to judge
    assert format_accepts("color", "not checked")
