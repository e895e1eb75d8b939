"""tts-espeak through the real router: a sentence becomes a WAV in the agent's work folder; a voice
eSpeak NG does not know is `voice_unknown`."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from reconciler.cli import main as handler
from tests.fixtures.harness import RawClient, body, serving, short_dir

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng is not installed (apt-get install espeak-ng; CI installs it)")

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/tts-espeak"


@pytest.fixture
def tree() -> Iterator[Path]:
    """The shipped config tree in a short folder (sockets live beside it), its `assistant` profile's tts
    swapped to `tts-local` (this connector with the en-us voice); the profile allows tts_synthesize
    without approval."""
    with short_dir() as folder:
        root = folder / "t"
        for part in ("catalog/interfaces", "catalog/connectors", "config"):
            shutil.copytree(REPO / part, root / part)
        profile = root / "config/profiles/assistant.toml"
        shipped = profile.read_text()
        assert 'tts = "tts-festival-local"' in shipped
        profile.write_text(shipped.replace('tts = "tts-festival-local"', 'tts = "tts-local"'))
        (root / "work/assistant").mkdir(parents=True)
        yield root


def test_a_sentence_becomes_a_wav_at_the_agents_path_and_an_unknown_voice_is_refused(tree: Path) -> None:
    scope = tree / "work/assistant"
    (scope / "out").mkdir()
    (scope / "out/reply.wav").write_bytes(b"an older file, replaced")

    async def scenario() -> list[dict[str, Any]]:
        with short_dir() as run_dir:
            async with serving(tree, run_dir) as router:
                client = await RawClient.connect(router.socket_path("assistant"))
                results = [
                    await client.call("tts_synthesize", {"text": "The invoice total is fifty euros.",
                                                         "outputPath": "out/reply.wav"}),
                    await client.call("tts_synthesize", {"text": "Bonjour à tous.", "voice": "fr+f3",
                                                         "outputPath": "briefing.wav"}),
                    await client.call("tts_synthesize", {"text": "Hello.", "voice": "no-such-voice",
                                                         "outputPath": "never.wav"}),
                    await client.call("tts_synthesize", {"text": "Hello.", "voice": "en-us+no-such-variant",
                                                         "outputPath": "never.wav"}),
                    await client.call("tts_synthesize", {"text": "Hello.", "voice": "--help",
                                                         "outputPath": "never.wav"}),
                ]
                await client.close()
                return results

    spoken, french, unknown, variant, option = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert spoken.get("isError") is False, spoken
    out = spoken["structuredContent"]
    assert out["path"] == "out/reply.wav"  # the agent's own path, never the connector's copy
    written = scope / "out/reply.wav"
    assert written.read_bytes()[:4] == b"RIFF"
    assert written.read_bytes()[8:12] == b"WAVE"
    assert out["bytes"] == written.stat().st_size > 10_000
    with wave.open(str(written), "rb") as audio:
        assert audio.getnchannels() == 1
        assert audio.getnframes() > 0
        seconds = audio.getnframes() / audio.getframerate()
    assert 0.5 < seconds < 10
    assert out["durationSeconds"] == pytest.approx(seconds, abs=0.01)

    assert french.get("isError") is False, french
    assert french["structuredContent"]["path"] == "briefing.wav"
    assert (scope / "briefing.wav").read_bytes()[:4] == b"RIFF"

    for refused in (unknown, variant, option):  # the engine itself would fall back quietly
        assert refused["isError"] is True, refused
        assert body(refused)["error"] == "voice_unknown"
    assert "no-such-voice" in body(unknown)["message"]
    assert "Error:" not in body(unknown)["message"]  # plain words, not the engine's own
    assert not (scope / "never.wav").exists()


def test_without_the_engine_every_call_is_unavailable_in_plain_words(tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=[str(CONNECTOR / "main.py")], cwd=str(CONNECTOR),
                                   env={"PATH": str(tmp_path)})  # an empty folder: no espeak-ng on the PATH

    async def called() -> Any:
        async with Client(params) as client:
            return await client.call_tool("tts_synthesize", {"text": "Hello.", "outputPath": str(tmp_path / "a.wav")})

    result = asyncio.run(asyncio.wait_for(called(), 30))
    assert result.is_error
    assert result.structured_content["error"] == "unavailable"
    assert "not installed" in result.structured_content["message"]
    assert (result.meta or {}).get("handler/retry") == "never"  # until someone installs it: not "later"
    assert "do without this service for now and tell the user" in result.structured_content["message"]
    assert not (tmp_path / "a.wav").exists()


# The engine as the connector runs it, except that it fails at once on every text, before reading it (exit status 1),
# or reads the text and writes no WAV at all: the voices it lists are the real engine's.
FAILING_ENGINE = """#!/bin/sh
case "$1" in --voices*) exec {real} "$@" ;; esac
[ "{how}" = fails ] && {{ echo "espeak-ng: internal error" >&2; exit 1; }}
/bin/cat > /dev/null
exit 0
"""


@pytest.mark.parametrize(("how", "says"), [("fails", "the speech engine failed on this text"),
                                           ("writes nothing", "the speech engine wrote no usable audio")])
def test_an_engine_failing_on_a_text_says_the_same_text_fails_again(tmp_path: Path, how: str, says: str) -> None:
    """A failure of the engine on one text is the same every time: the model is told to change the text, and
    `handler/retry` is `never`, not the `later` of a service that is down."""
    engine = tmp_path / "espeak-ng"
    engine.write_text(FAILING_ENGINE.format(real=shutil.which("espeak-ng"), how=how))
    engine.chmod(0o755)
    params = StdioServerParameters(command=sys.executable, args=[str(CONNECTOR / "main.py")], cwd=str(CONNECTOR),
                                   env={"PATH": str(tmp_path)})

    async def called() -> Any:
        async with Client(params) as client:
            return await client.call_tool("tts_synthesize", {"text": "Hello.", "outputPath": str(tmp_path / "a.wav")})

    result = asyncio.run(asyncio.wait_for(called(), 30))
    assert result.is_error
    message = result.structured_content["message"]
    assert (result.structured_content["error"], says in message) == ("unavailable", True), message
    assert "rephrase or shorten the text, or choose another voice" in message
    assert "retrying later" not in message
    assert (result.meta or {}).get("handler/retry") == "never"


def test_the_check_fails_it_on_intelligibility_alone(shipped_tree: Path, tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """Its WAV files are well formed and its errors right; its sentences drawn afresh, heard back by PocketSphinx,
    come back with more than 40% of their words wrong (measured 72-75%), so it is not listed."""
    assert handler(["connector", "install", "transcribe-pocketsphinx", "--root", str(shipped_tree)]) == 0
    code = handler(["connector", "check", "tts-espeak", "--binding", "tts-local", "--root", str(shipped_tree),
                    "--examples", "12", "--seed", "7", "--json", str(tmp_path / "result.json"), "--no-record"])
    out = capfd.readouterr().out
    assert code == 1, out
    result = json.loads((tmp_path / "result.json").read_text())
    summary = result["interfaces"]["tts/v1"]
    assert summary["cases"] == {"passed": 3, "failed": 1, "skipped": 0}
    assert summary["fuzzing_pass"]
    failed = [i for i in result["items"] if i["outcome"] == "failed"]
    assert [i["name"] for i in failed] == ["sentences drawn afresh are heard back"]
    assert "heard back by transcribe/v1: the word error rate is" in failed[0]["message"]
    assert summary["measured"]["sentences drawn afresh are heard back"]["path.spokenWordErrorRate"] > 0.4
