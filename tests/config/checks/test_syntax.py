"""checks.syntax, case by case: TOML and JSON syntax, apiVersion and the model's keys and types."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.checks.casework import case_dirs, case_id, case_named, check_case, findings_of


@pytest.mark.parametrize("case", case_dirs("syntax"), ids=case_id)
def test_case(case: Path) -> None:
    check_case(case)


def test_an_unknown_key_says_did_you_mean() -> None:
    (finding,) = findings_of(case_named("syntax/F004-unknown-key"))
    assert "did you mean 'template'?" in finding.message


def test_a_secret_reference_is_one_finding_in_plain_words_that_never_repeats_the_value() -> None:
    findings = findings_of(case_named("syntax/F004-secret-reference"))
    text = "".join(f.render_text() for f in findings)
    assert "123456" not in text  # a number written where a reference goes may be the secret itself
    for pasted in ("a8Fj29Dkq0Lm3Nx7Pq1Rs5Tu", "sk-proj-", "ghp_"):  # a key pasted where a reference names a place
        assert pasted not in text
    for internal in ("function-after", "SecretRef", "'secrets."):  # pydantic's names for the union and its members
        assert internal not in text
    slots = [f.message.split("'")[1] for f in findings if f.code == "F004"]
    assert len(slots) == len(set(slots)) == 13  # one finding per slot
