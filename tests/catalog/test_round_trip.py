"""The round trip through the real, sandboxed router: a local voice speaks, the local recognizer hears.

The shipped `assistant` profile binds tts to `tts-festival-local` (Festival's cmu_us_slt voice) and
transcribe to `transcribe-local` (PocketSphinx). A fixed set of sentences, none of them among
transcribe/v1's conformance recordings, is spoken by `tts_synthesize` into the agent's work folder and
heard by `transcribe_audio` from there, as an agent would chain the two. The recognizer gets the
audio only: no grammar, keyword list or hint drawn from the sentences.

The floor is on content words (the words left when a fixed list of English function words is set
aside), over the whole set: measured here, 40 of the 41 content words came back (97.6%; nine of the
ten sentences word for word, "water" heard as "what're"); the floor, 85%, leaves room for engine
updates without letting a voice the recognizer cannot follow pass (eSpeak NG's en-us voice at 160
words a minute, measured the same way, gets 22 of 41: 54%, no sentence word for word).
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main as handler
from tests.fixtures.harness import RawClient, serving, short_dir

pytestmark = pytest.mark.skipif(shutil.which("text2wave") is None,
                                reason="Festival is not installed (apt-get install festival festvox-us-slt-hts; "
                                       "CI installs it)")

REPO = Path(__file__).resolve().parents[2]
SENTENCES = (
    "The doctor will see you on Monday afternoon.",
    "Please close the window before you leave the office.",
    "Our new printer is on the second floor.",
    "The children played football in the park.",
    "He forgot his keys at the hotel.",
    "The price of coffee went up again this year.",
    "Water the plants twice a week during the summer.",
    "The bank opens at nine in the morning.",
    "She wrote a long letter to her brother.",
    "The library closes early on Friday.",
)
# English function words: what is left of a sentence without them is what it is about.
FUNCTION_WORDS = frozenset(
    "a an the of to in on at for by with and or but is are was were be been it its this that these those he "  # noqa: SIM905 - the words read as prose
    "she they we you i his her their our your my me him them us will would can could shall should may might "
    "must do does did have has had not no so as from up down out into over again before after during".split(" "))
FLOOR = 0.85


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def content_words(text: str) -> list[str]:
    return [w for w in words_of(text) if w not in FUNCTION_WORDS]


@pytest.fixture
def tree() -> Iterator[Path]:
    """The shipped config tree in a short folder (sockets live beside it), with the assistant's work folder."""
    assert handler(["connector", "install", "transcribe-pocketsphinx", "--root", str(REPO)]) == 0
    with short_dir() as folder:
        root = folder / "t"
        for part in ("catalog/interfaces", "catalog/connectors", "config"):
            shutil.copytree(REPO / part, root / part)
        (root / "work/assistant").mkdir(parents=True)
        yield root


def test_festivals_voice_is_heard_by_the_local_recognizer_through_the_router(tree: Path) -> None:
    async def scenario() -> list[tuple[dict[str, Any], dict[str, Any]]]:
        pairs = []
        with short_dir() as run_dir:
            async with serving(tree, run_dir) as router:
                client = await RawClient.connect(router.socket_path("assistant"))
                for number, sentence in enumerate(SENTENCES):
                    path = f"voice/sentence-{number}.wav"
                    spoken = await client.call("tts_synthesize", {"text": sentence, "outputPath": path})
                    heard = await client.call("transcribe_audio", {"path": path})
                    pairs.append((spoken, heard))
                await client.close()
        return pairs

    pairs = asyncio.run(asyncio.wait_for(scenario(), 240))
    expected = found = 0
    report = []
    for sentence, (spoken, heard) in zip(SENTENCES, pairs, strict=True):
        assert spoken.get("isError") is False, spoken
        assert heard.get("isError") is False, heard
        transcript = heard["structuredContent"]["text"]
        said, back = content_words(sentence), set(words_of(transcript))
        expected += len(said)
        found += sum(word in back for word in said)
        report.append(f"{sentence!r} -> {transcript!r}")
    assert (tree / "work/assistant/voice/sentence-0.wav").read_bytes()[:4] == b"RIFF"
    assert expected == 41
    assert found / expected >= FLOOR, f"{found} of {expected} content words heard:\n" + "\n".join(report)
