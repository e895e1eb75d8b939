"""Case assertions (docs/conformance.md), as `conformance.cases` evaluates them: each holding and failing."""

from __future__ import annotations

import re
from typing import Any

import pytest

from conformance.cases import evaluate_case, strings_in, word_error_rate
from conformance.replies import Reply
from reconciler.config.cases import CaseError, parse_case

OUTPUT = {
    "pages": [{"text": "Invoice INV-2024-0042\nTotal: 50.00 EUR", "blocks": [{"text": "Total", "bbox": [1, 2, 3, 4]}]},
              {"text": "page two", "blocks": []}],
    "usage": {"outputTokens": 3},
    "stopReason": "max_tokens",
    "results": [{"url": "https://example.org"}, {"url": "http://example.com/a"}],
    "tags": ["a", "b"],
}


def executed(output: Any) -> Reply:
    return Reply({"isError": False, "structuredContent": output}, 0.01)


def failed(code: str, cause: str | None = None) -> Reply:
    meta = {"handler/cause": cause} if cause else {}
    return Reply({"isError": True, "structuredContent": {"error": code, "message": "it broke"}, "_meta": meta}, 0.01)


def case(**expect: Any) -> Any:
    return parse_case({"name": "c", "tool": "t", "input": {}, "expect": expect})


@pytest.mark.parametrize(("expect", "holds"), [
    ({"pages": {"minItems": 1}}, True),
    ({"pages": {"minItems": 3}}, False),
    ({"results": {"maxItems": 5}}, True),
    ({"results": {"maxItems": 1}}, False),
    ({"pages": {"0": {"text": {"minLength": 10}}}}, True),
    ({"pages": {"1": {"text": {"minLength": 10}}}}, False),
    ({"stopReason": {"maxLength": 200}}, True),
    ({"stopReason": {"maxLength": 3}}, False),
    ({"usage": {"outputTokens": {"minimum": 1}}}, True),
    ({"usage": {"outputTokens": {"minimum": 4}}}, False),
    ({"usage": {"outputTokens": {"maximum": 5}}}, True),
    ({"usage": {"outputTokens": {"maximum": 2}}}, False),
    ({"stopReason": {"equals": "max_tokens"}}, True),
    ({"stopReason": {"equals": "end_turn"}}, False),
    ({"results": {"*": {"url": {"matches": "^https?://"}}}}, True),
    ({"results": {"*": {"url": {"matches": "^https://"}}}}, False),  # the second is http: every item must hold
    ({"pages": {"0": {"text": {"contains": "Total"}}}}, True),
    ({"pages": {"1": {"text": {"contains": "Total"}}}}, False),
    ({"tags": {"contains": "b"}}, True),
    ({"tags": {"contains": "c"}}, False),
    ({"pages": {"exists": True}}, True),
    ({"segments": {"exists": True}}, False),
    ({"segments": {"exists": False}}, True),
    ({"pages": {"exists": False}}, False),
    ({"pages": {"*": {"blocks": {"*": {"bbox": {"minItems": 4}}}}}}, True),
    ({"contains": ["INV-2024-0042", "Total"]}, True),
    ({"contains": ["INV-2024-0042", "Grand total"]}, False),
])
def test_each_assertion_holds_or_fails_as_documented(expect: dict[str, Any], holds: bool) -> None:
    problems = evaluate_case(case(**expect), executed(OUTPUT))
    assert (problems == []) == holds, problems


def test_a_failure_names_the_path_the_assertion_and_what_was_there() -> None:
    problems = evaluate_case(case(pages={"minItems": 3}, usage={"outputTokens": {"maximum": 2}}), executed(OUTPUT))
    assert problems == ["pages.minItems = 3: it has 2 items", "usage.outputTokens.maximum = 2: the value is 3"]


def test_every_failed_assertion_is_reported_not_the_first() -> None:
    problems = evaluate_case(case(results={"*": {"url": {"matches": "^https://"}}}, segments={"exists": True},
                                  contains=["nowhere"]), executed(OUTPUT))
    assert len(problems) == 3
    assert any("results.1.url.matches" in p for p in problems)


def test_a_wrong_kind_of_value_is_said_plainly() -> None:
    assert evaluate_case(case(stopReason={"minItems": 1}), executed(OUTPUT)) == [
        "stopReason.minItems = 1: expected an array, got the string 'max_tokens'"]
    assert evaluate_case(case(pages={"minimum": 1}), executed(OUTPUT)) == [
        "pages.minimum = 1: expected a number, got an array"]


def test_an_expected_error_must_be_that_code() -> None:
    expect_error = case(error="unsupported_format")
    assert evaluate_case(expect_error, failed("unsupported_format")) == []
    assert evaluate_case(expect_error, failed("unavailable", "crashed")) == [
        "expected the error 'unsupported_format', got the error 'unavailable' (the router's cause: crashed): it broke"]
    assert evaluate_case(expect_error, executed({"pages": []})) == [
        "expected the error 'unsupported_format', but the call succeeded with {'pages': []}"]


def test_an_expected_output_fails_on_an_error() -> None:
    assert evaluate_case(case(pages={"minItems": 1}), failed("too_large")) == [
        "expected an output, got the error 'too_large': it broke"]


def test_strings_in_reads_values_not_keys() -> None:
    assert sorted(strings_in({"key": ["a", {"inner": "b", "n": 1}], "other": None})) == ["a", "b"]


REFERENCE = "Please send the report to the finance team."


@pytest.mark.parametrize(("heard", "rate"), [
    ("please send the report to the finance team", 0.0),  # case and punctuation are not errors
    ("Please send a report to the finance team!", 1 / 8),  # one substitution
    ("please send report to the finance team", 1 / 8),  # one deletion
    ("please send the report to the the finance team", 1 / 8),  # one insertion
    ("the train to the set she leaves every hour", 1.0),
    ("", 1.0),
])
def test_the_word_error_rate_counts_substitutions_deletions_and_insertions(heard: str, rate: float) -> None:
    assert word_error_rate(heard, REFERENCE)[0] == pytest.approx(rate)


def test_a_word_error_rate_bound_holds_or_fails_saying_the_rate_and_what_was_heard() -> None:
    bound = case(text={"wordErrorRate": {"reference": REFERENCE, "maximum": 0.2}})
    assert evaluate_case(bound, executed({"text": "please send a report to the finance team"})) == []
    (problem,) = evaluate_case(bound, executed({"text": "please spend a report on the finance team"}))
    assert problem.startswith("text.wordErrorRate = ")
    assert "the word error rate is 0.38 (3 errors in 8 words), over 0.2: heard 'please spend a report" in problem


@pytest.mark.parametrize(("value", "says"), [
    (0.3, "is a table { reference"),
    ({"reference": REFERENCE}, "is a table { reference"),
    ({"reference": " ", "maximum": 0.3}, "reference is the text said"),
    ({"reference": REFERENCE, "maximum": -1}, "maximum is a number, 0 or more"),
    ({"reference": REFERENCE, "maximum": True}, "maximum is a number, 0 or more"),
])
def test_a_malformed_word_error_rate_bound_is_refused(value: Any, says: str) -> None:
    with pytest.raises(CaseError, match=re.escape(says)):
        case(text={"wordErrorRate": value})


VECTORS = {"vectors": [[1.0, 0.0, 0.0], [0.9, 0.3, 0.0], [0.5, 0.0, 0.8]], "dimensions": 3}


def test_nearer_by_cosine_holds_when_near_is_nearer_than_far_by_the_margin() -> None:
    nearer = case(vectors={"nearerByCosine": {"anchor": 0, "near": 1, "far": 2}})
    assert evaluate_case(nearer, executed(VECTORS)) == []
    swapped = case(vectors={"nearerByCosine": {"anchor": 0, "near": 2, "far": 1}})
    (problem,) = evaluate_case(swapped, executed(VECTORS))
    assert problem.startswith("vectors.nearerByCosine = ")
    assert problem.endswith("item 2 is not nearer to item 0 than item 1: cosine similarity 0.530 against 0.949")
    wide = case(vectors={"nearerByCosine": {"anchor": 0, "near": 1, "far": 2, "margin": 0.5}})
    (problem,) = evaluate_case(wide, executed(VECTORS))
    assert "than item 2 by 0.5: cosine similarity 0.949 against 0.530" in problem


@pytest.mark.parametrize(("output", "says"), [
    ({"vectors": [[1.0], [1.0]]}, "expected an array of at least 3 vectors"),
    ({"vectors": "no"}, "expected an array of at least 3 vectors, got the string 'no'"),
    ({"vectors": [[1.0, 0.0], [1.0], [0.0, 1.0]]}, "vectors of numbers of one length"),
    ({"vectors": [[1.0], ["a"], [0.0]]}, "vectors of numbers of one length"),
])
def test_nearer_by_cosine_on_the_wrong_shape_says_so(output: Any, says: str) -> None:
    nearer = case(vectors={"nearerByCosine": {"anchor": 0, "near": 1, "far": 2}})
    (problem,) = evaluate_case(nearer, executed(output))
    assert says in problem


@pytest.mark.parametrize(("value", "says"), [
    (0, "is a table { anchor = 0, near = 1, far = 2 }"),
    ({"anchor": 0, "near": 1}, "is a table { anchor = 0, near = 1, far = 2 }"),
    ({"anchor": 0, "near": 1, "far": 2, "by": 1}, "is a table { anchor = 0, near = 1, far = 2 }"),
    ({"anchor": 0, "near": 0, "far": 2}, "three different item indexes"),
    ({"anchor": -1, "near": 1, "far": 2}, "three different item indexes"),
    ({"anchor": 0, "near": True, "far": 2}, "three different item indexes"),
    ({"anchor": 0, "near": 1, "far": 2, "margin": 3}, "margin is a number from 0 to 2"),
])
def test_a_malformed_nearer_by_cosine_is_refused(value: Any, says: str) -> None:
    with pytest.raises(CaseError, match=re.escape(says)):
        case(vectors={"nearerByCosine": value})
