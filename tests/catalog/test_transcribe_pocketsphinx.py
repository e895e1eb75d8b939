"""transcribe-pocketsphinx: transcribe/v1 on PocketSphinx, in its own environment (`[needs]`), offline.

`handler connector check` passes with fuzzing through the real router and sandbox, on recordings whose
word error rate the cases bound; what it refuses (formats it does not decode, languages it does not
know) is said in plain words. Its environment is built by `handler connector install` (once: CI builds
it before the suite; here it is a no-op then).
"""

from __future__ import annotations

import asyncio
import json
import wave
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from reconciler.cli import main as handler
from reconciler.config import FolderSource, Loader
from reconciler.connectors.environments import environment_path
from reconciler.connectors.launching import kit_env
from tests.fixtures.vendor_trees import passing_check

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/transcribe-pocketsphinx"
RECORDINGS = REPO / "catalog/interfaces/transcribe/v1/conformance"


@pytest.fixture(scope="module")
def python() -> Path:
    """The connector's own Python: `handler connector install` builds its environment when it is not built."""
    assert handler(["connector", "install", "transcribe-pocketsphinx", "--root", str(REPO)]) == 0
    path = environment_path(Loader().load(FolderSource(REPO)).connectors["transcribe-pocketsphinx"])
    assert path is not None
    return path / "bin/python3"


def calls(python: Path, *arguments: dict[str, Any]) -> list[Any]:
    params = StdioServerParameters(command=str(python), args=[str(CONNECTOR / "main.py")], cwd=str(CONNECTOR),
                                   env={"PATH": "/usr/bin:/bin", **kit_env(REPO)})

    async def called() -> list[Any]:
        async with Client(params) as client:
            listed = await client.list_tools()
            results = [await client.call_tool("transcribe_audio", a) for a in arguments]
            return [[t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools], *results]

    return asyncio.run(asyncio.wait_for(called(), 60))


def test_it_passes_the_check_with_fuzzing(shipped_tree: Path, tmp_path: Path, python: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    summary = passing_check("transcribe-pocketsphinx", "transcribe-local", shipped_tree, "transcribe/v1",
                            examples=12, seed=7, result=tmp_path / "result.json", capfd=capfd)
    assert summary["cases"]["passed"] == 10  # eight recordings bounded by word error rate, among them
    assert summary["fuzzing_pass"]


def write_wav(path: Path, frames: bytes, *, rate: int, width: int, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(frames)
    return path


def test_what_it_reads_and_what_it_refuses_in_plain_words(python: Path, tmp_path: Path) -> None:
    with wave.open(str(RECORDINGS / "car.wav"), "rb") as audio:
        pcm = audio.readframes(audio.getnframes())
    # 24-bit, stereo, 32 kHz: each 16-bit sample widened, put in both channels, held for two frames.
    wide = b"".join(b"\x00" + pcm[i:i + 2] for i in range(0, len(pcm), 2))
    frames = b"".join(wide[i:i + 3] * 4 for i in range(0, len(wide), 3))
    other = write_wav(tmp_path / "car-24bit-stereo-32k.wav", frames, rate=32000, width=3, channels=2)
    silence = write_wav(tmp_path / "silence.wav", bytes(32000), rate=16000, width=2)
    mp3 = tmp_path / "speech.wav"  # named .wav: judged by its bytes
    mp3.write_bytes(b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(500))
    tools, heard, quiet, refused, french = calls(
        python, {"path": str(other)}, {"path": str(silence)}, {"path": str(mp3)},
        {"path": str(RECORDINGS / "car.wav"), "language": "fr"})
    assert tools == json.loads((REPO / "catalog/interfaces/transcribe/v1/tools.json").read_text())
    assert not heard.is_error
    assert heard.structured_content["text"] == "she bought a new car last summer"
    assert heard.structured_content["language"] == "en"
    segment = heard.structured_content["segments"][0]
    assert 0 <= segment["start"] < segment["end"] <= 2.5
    assert quiet.structured_content["text"] == ""
    assert refused.is_error
    assert refused.structured_content["error"] == "unsupported_format"
    assert "MP3" in refused.structured_content["message"]
    assert "ffmpeg -i in.mp3 -ac 1 -ar 16000 out.wav" in refused.structured_content["message"]
    assert french.is_error
    assert french.structured_content["error"] == "unavailable"
    assert "English (en) only, not 'fr'" in french.structured_content["message"]
    assert (french.meta or {}).get("handler/retry") == "never"  # the same language fails again: not "later"
