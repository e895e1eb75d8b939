"""tts-festival: tts/v1 on Festival's cmu_us_slt voice, offline.

`handler connector check` passes with fuzzing through the real router and sandbox; what the voice
cannot say (other scripts, a text of symbols only) is a valid WAV rather than a failure, and a voice
Festival does not have is `voice_unknown` in plain words.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import wave
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from reconciler.cli import main as handler
from tests.fixtures.vendor_trees import passing_check

pytestmark = pytest.mark.skipif(shutil.which("text2wave") is None,
                                reason="Festival is not installed (apt-get install festival festvox-us-slt-hts; "
                                       "CI installs it)")

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/tts-festival"


def calls(path: str, *arguments: dict[str, Any]) -> list[Any]:
    """tools/list, then each call, straight to the connector with `path` as its PATH."""
    params = StdioServerParameters(command=sys.executable, args=[str(CONNECTOR / "main.py")], cwd=str(CONNECTOR),
                                   env={"PATH": path, "FESTIVAL_SAMPLE_RATE": "16000"})

    async def called() -> list[Any]:
        async with Client(params) as client:
            listed = await client.list_tools()
            results = [await client.call_tool("tts_synthesize", a) for a in arguments]
            return [[t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools], *results]

    return asyncio.run(asyncio.wait_for(called(), 60))


def test_it_passes_the_check_with_fuzzing(shipped_tree: Path, tmp_path: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    assert handler(["connector", "install", "transcribe-pocketsphinx", "--root", str(shipped_tree)]) == 0
    summary = passing_check("tts-festival", "tts-festival-local", shipped_tree, "tts/v1", examples=12, seed=7,
                            result=tmp_path / "result.json", capfd=capfd)
    assert summary["cases"]["passed"] == 4  # its sentences drawn afresh heard back by PocketSphinx among them
    assert summary["fuzzing_pass"]
    rate = summary["measured"]["sentences drawn afresh are heard back"]["path.spokenWordErrorRate"]
    assert rate <= 0.4


def seconds_of(path: Path) -> tuple[float, int]:
    with wave.open(str(path), "rb") as audio:
        return audio.getnframes() / audio.getframerate(), audio.getframerate()


def test_what_it_says_and_what_it_refuses_in_plain_words(tmp_path: Path) -> None:
    tools, spoken, accented, foreign, unknown, option = calls(
        "/usr/bin:/bin",
        {"text": "The invoice total is fifty euros.", "outputPath": str(tmp_path / "invoice.wav")},
        {"text": "Meet me at the café.", "outputPath": str(tmp_path / "cafe.wav")},
        {"text": "日本語 ☃", "outputPath": str(tmp_path / "foreign.wav")},
        {"text": "Hello.", "voice": "no_such_voice", "outputPath": str(tmp_path / "never.wav")},
        {"text": "Hello.", "voice": "kal) (quit", "outputPath": str(tmp_path / "never.wav")})
    assert tools == json.loads((REPO / "catalog/interfaces/tts/v1/tools.json").read_text())
    assert not spoken.is_error, spoken
    seconds, rate = seconds_of(tmp_path / "invoice.wav")
    assert rate == 16000
    assert 1.0 < seconds < 10
    assert spoken.structured_content["durationSeconds"] == pytest.approx(seconds, abs=0.01)
    assert spoken.structured_content["bytes"] == (tmp_path / "invoice.wav").stat().st_size
    assert not accented.is_error
    assert seconds_of(tmp_path / "cafe.wav")[0] > 0.5
    assert not foreign.is_error  # nothing this voice can say: a valid WAV of no length
    assert foreign.structured_content["durationSeconds"] == 0
    for refused in (unknown, option):
        assert refused.is_error
        assert refused.structured_content["error"] == "voice_unknown"
        assert "cmu_us_slt_arctic_hts" in refused.structured_content["message"]  # what it offers instead
    assert "'no_such_voice'" in unknown.structured_content["message"]
    assert "quit" not in option.structured_content["message"]
    assert not (tmp_path / "never.wav").exists()


def test_a_default_voice_not_installed_fails_a_call_without_a_voice_for_good_and_names_those_that_work(
        tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=[str(CONNECTOR / "main.py")], cwd=str(CONNECTOR),
                                   env={"PATH": "/usr/bin:/bin", "FESTIVAL_SAMPLE_RATE": "16000",
                                        "FESTIVAL_VOICE": "no_such_default"})

    async def called() -> list[Any]:
        async with Client(params) as client:
            return [await client.call_tool("tts_synthesize", {"text": "Hello.", "outputPath": str(tmp_path / name),
                                                              **voice})
                    for name, voice in (("a.wav", {}), ("b.wav", {"voice": "cmu_us_slt_arctic_hts"}))]

    without, named = asyncio.run(asyncio.wait_for(called(), 60))
    assert without.is_error
    message = without.structured_content["message"]
    assert (without.structured_content["error"], (without.meta or {}).get("handler/retry")) == ("unavailable", "never")
    assert "default voice 'no_such_default' is not installed" in message
    assert "name one of" in message
    assert "cmu_us_slt_arctic_hts" in message  # the call that works instead
    assert not named.is_error, named
    assert (tmp_path / "b.wav").read_bytes()[:4] == b"RIFF"


def test_without_the_engine_every_call_is_unavailable_in_plain_words(tmp_path: Path) -> None:
    _, result = calls(str(tmp_path), {"text": "Hello.", "outputPath": str(tmp_path / "a.wav")})  # no festival
    assert result.is_error
    assert result.structured_content["error"] == "unavailable"
    assert "not installed" in result.structured_content["message"]
    assert (result.meta or {}).get("handler/retry") == "never"  # until someone installs it: not "later"
    assert not (tmp_path / "a.wav").exists()
