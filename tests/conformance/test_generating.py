"""Inputs drawn afresh: words, sentences and page images, new on every run, substituted into the case."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conformance.cases import word_error_rate
from conformance.generating import realize_case
from reconciler.config.cases import CaseError, parse_case, read_sentence_patterns

WORDS = b"# a comment\napple river garden window\nmorning table doctor letter  # more\n"
SENTENCES = b'patterns = ["the {noun} {verb}"]\nnoun = ["doctor", "teacher"]\nverb = ["opened", "closed"]\n'


def page_case() -> dict[str, object]:
    return {"name": "a page", "tool": "ocr_extract",
            "generate": {"words": {"words": "words.txt", "count": 12}, "scan": {"page": "{words}"}},
            "input": {"path": "{scan}"},
            "expect": {"pages": {"0": {"text": {"wordErrorRate": {"reference": "{words}", "maximum": 0.1}}}}}}


def test_each_run_draws_afresh_and_substitutes_input_and_expectations(tmp_path: Path) -> None:
    case = parse_case(page_case())
    fixtures = {"words.txt": WORDS}
    first, drawn = realize_case(case, fixtures, tmp_path)
    second, again = realize_case(case, fixtures, tmp_path)
    assert len(drawn["words"].split()) == 12
    assert set(drawn["words"].split()) <= {"apple", "river", "garden", "window", "morning", "table", "doctor", "letter"}
    assert drawn != again  # 8**12 draws: the same twice would be a broken generator
    assert first.input == {"path": drawn["scan"]}
    assert (tmp_path / drawn["scan"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.assertions[0].value == {"reference": drawn["words"], "maximum": 0.1}
    assert second.assertions[0].value["reference"] == again["words"]


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract is not installed (CI installs it)")
def test_a_rendered_page_reads_back_as_its_words(tmp_path: Path) -> None:
    _, drawn = realize_case(parse_case(page_case()), {"words.txt": WORDS}, tmp_path)
    read = subprocess.run(["tesseract", str(tmp_path / drawn["scan"]), "-"], capture_output=True, text=True,
                          check=True).stdout
    assert word_error_rate(read, drawn["words"])[0] == 0


def test_sentences_come_from_the_patterns_with_each_slot_filled(tmp_path: Path) -> None:
    case = parse_case({"name": "speech", "tool": "tts_synthesize",
                       "generate": {"text": {"sentences": "s.toml", "count": 3}}, "input": {"text": "{text}"}})
    _, drawn = realize_case(case, {"s.toml": SENTENCES}, tmp_path)
    sentences = drawn["text"].split(". ")
    assert len(sentences) == 3
    for sentence in sentences:
        words = sentence.rstrip(".").split()
        assert words[0] == "The"
        assert words[1] in ("doctor", "teacher")
        assert words[2] in ("opened", "closed")


@pytest.mark.parametrize(("generate", "says"), [
    ({"w": {"words": "words.txt"}}, "generate.w.count is how many words to draw, 1 to 200"),
    ({"w": {"words": "words.txt", "count": 3, "page": "x"}}, "is one of"),
    ({"Bad": {"page": "x"}}, "a name is lower case letters"),
    ({"scan": {"page": "{words}"}, "words": {"words": "w.txt", "count": 2}}, "which no generator declared before it"),
    ({"w": {"page": "x", "count": 2}}, "unknown key(s) count"),
])
def test_a_malformed_generator_is_refused(generate: dict[str, object], says: str) -> None:
    with pytest.raises(CaseError, match=r".*" + says.replace("(", r"\(").replace(")", r"\)")):
        parse_case({"name": "c", "tool": "t", "generate": generate, "input": {}})


def test_a_sentences_file_naming_a_slot_without_words_is_refused() -> None:
    with pytest.raises(CaseError, match="names the slot"):
        read_sentence_patterns(b'patterns = ["the {noun} {verb}"]\nnoun = ["doctor"]\n')
