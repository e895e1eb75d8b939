"""Inputs drawn afresh for each run of a case (`generate` in docs/conformance.md), called by the case items.

A case whose fixtures never change can be passed by a connector that recognises them. A generated
case draws its words or sentences from a list in the conformance folder with the system's randomness
(never the run's seed, which whoever runs the check may choose), renders a page image of them where
it asks, and substitutes `{name}` in its input and expectations, so only a connector that really
reads, hears or speaks passes. What was drawn is returned with the case, for the report.
"""

from __future__ import annotations

import random
import re
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

from conformance.errors import CheckError
from reconciler.config.cases import Assertion, Case, Generator, read_sentence_patterns, read_word_list

__all__ = ["realize_case", "render_page"]

_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")
PAGE_WIDTH, MARGIN, FONT_SIZE = 1700, 100, 44  # an A4-like page at ~200 dpi, text at ~16 pt


def realize_case(case: Case, fixtures: dict[str, bytes], work: Path) -> tuple[Case, dict[str, str]]:
    """`case` with its placeholders replaced by fresh draws (pages written under `work`), and what was drawn."""
    if not case.generate:
        return case, {}
    draw = random.SystemRandom()
    drawn: dict[str, str] = {}
    for gen in case.generate:
        drawn[gen.name] = _draw(gen, fixtures, draw, work, drawn)
    assertions = tuple(Assertion(a.path, a.op, _substitute(a.value, drawn)) for a in case.assertions)
    realized = replace(case, input=_substitute(case.input, drawn), assertions=assertions,
                       contains=tuple(_substitute(list(case.contains), drawn)))
    return realized, drawn


def _draw(gen: Generator, fixtures: dict[str, bytes], draw: random.SystemRandom, work: Path,
          drawn: dict[str, str]) -> str:
    if gen.kind == "page":
        rel = f"generated/{gen.name}-{secrets.token_hex(6)}.png"
        render_page(_substitute(gen.source, drawn), work / rel)
        return rel
    data = fixtures.get(gen.source)
    if data is None:
        raise CheckError(f"generate.{gen.name} draws from '{gen.source}', which is not in the conformance folder")
    if gen.kind == "words":
        words = read_word_list(data)
        return " ".join(draw.choice(words) for _ in range(gen.count))
    patterns = read_sentence_patterns(data)
    sentences = []
    for _ in range(gen.count):
        text = _PLACEHOLDER.sub(lambda m: draw.choice(patterns.slots[m[1]]), draw.choice(patterns.patterns))
        sentences.append(text[:1].upper() + text[1:] + ".")
    return " ".join(sentences)


def render_page(text: str, path: Path) -> None:
    """A white page with `text` in black, wrapped to its width, as a PNG (Pillow's own scalable font)."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise CheckError("a case draws a page image, which needs Pillow: pip install 'handler-services[conformance]'"
                         ) from None
    font = ImageFont.load_default(size=FONT_SIZE)
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(f"{lines[-1]} {word}") <= PAGE_WIDTH - 2 * MARGIN:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    step = int(FONT_SIZE * 1.6)
    image = Image.new("L", (PAGE_WIDTH, 2 * MARGIN + step * max(len(lines), 1)), 255)
    pen = ImageDraw.Draw(image)
    for number, line in enumerate(lines):
        pen.text((MARGIN, MARGIN + number * step), line, fill=0, font=font)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, dpi=(200, 200))


def _substitute(value: Any, drawn: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: drawn.get(m[1], m[0]), value)
    if isinstance(value, dict):
        return {k: _substitute(v, drawn) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, drawn) for v in value]
    return value
