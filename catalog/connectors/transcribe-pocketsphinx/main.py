"""transcribe-pocketsphinx: the transcribe/v1 connector on PocketSphinx, offline, an MCP server over stdio.

The router starts it as `python3 main.py` in this folder, on the connector's own environment (its
`[needs]`: PocketSphinx 5.1, whose wheel ships the US English acoustic model, language model and
dictionary, and the MCP SDK). Nothing is downloaded, nothing leaves the machine.

What it accepts: WAV files (RIFF/WAVE) holding integer PCM, 8, 16, 24 or 32 bits, any channel count
(mixed down to one) and any sample rate (resampled to the model's 16 kHz). Anything else, judged by
the file's first bytes (MP3, FLAC, OGG, M4A, float or compressed WAV, not audio at all), is the
interface error `unsupported_format`, saying to convert it to 16 kHz mono WAV. It transcribes US
English only: a call naming another language is `unavailable`, saying so.

The whole file is decoded as one utterance with the general English language model; no grammar,
keyword list or hint is used. A file in which the voice activity detector hears less than 0.3 s of
speech has an empty transcript (the recognizer would otherwise find words in silence). `segments` come from the decoder's word timings, split at pauses.
"""

from __future__ import annotations

import array
import hashlib
import io
import logging
import re
import sys
import threading
import wave
from collections import OrderedDict
from pathlib import Path
from typing import Any

import anyio
from handler_kit import Handler, InterfaceError, Reply, needs_a_person, serve

log = logging.getLogger("transcribe-pocketsphinx")

RATE = 16_000  # the acoustic model's sample rate
FRAMES_PER_SECOND = 100  # the decoder's frame rate: word timings are in these frames
PAUSE_FRAMES = 30  # a silence of 0.3 s or more between words ends a segment
MIN_SPEECH_SECONDS = 0.3  # less speech than this, by the voice activity detector, is silence: no words
_CACHE_SIZE = 32
_ALTERNATE = re.compile(r"\(\d+\)$")  # "the(2)": the dictionary's second pronunciation of "the"

# transcribe/v1's tool, word for word (a published interface version never changes).
_SEGMENT = {
    "type": "object", "additionalProperties": False, "required": ["start", "end", "text"],
    "properties": {
        "start": {"type": "number", "minimum": 0, "description": "seconds from the start of the file"},
        "end": {"type": "number", "minimum": 0, "description": "seconds from the start of the file"},
        "text": {"type": "string"},
    },
}

_OTHER_AUDIO = ((b"ID3", "MP3"), (b"\xff\xfb", "MP3"), (b"\xff\xf3", "MP3"), (b"\xff\xf2", "MP3"),
                (b"fLaC", "FLAC"), (b"OggS", "OGG"))
_CONVERT = "convert it to WAV, e.g. ffmpeg -i in.mp3 -ac 1 -ar 16000 out.wav"


def read_pcm(data: bytes) -> bytes:
    """16 kHz mono 16-bit PCM from a WAV file's bytes; `unsupported_format` for anything else."""
    if not (data[:4] == b"RIFF" and data[8:12] == b"WAVE"):
        kind = next((name for magic, name in _OTHER_AUDIO if data.startswith(magic)), None)
        if kind is None and data[4:8] == b"ftyp":
            kind = "M4A"
        said = f"this is {kind} audio, which this service does not decode" if kind else "this is not a WAV file"
        raise InterfaceError("unsupported_format", f"{said}: it reads WAV (integer PCM) only; {_CONVERT}")
    try:
        with wave.open(io.BytesIO(data), "rb") as audio:
            channels, width, rate = audio.getnchannels(), audio.getsampwidth(), audio.getframerate()
            frames = audio.readframes(audio.getnframes())
    except (wave.Error, EOFError) as exc:
        raise InterfaceError("unsupported_format", f"the WAV file cannot be read ({exc}): it reads integer PCM "
                                                   f"WAV only; {_CONVERT}") from None
    if width not in (1, 2, 3, 4) or channels < 1 or rate < 1000:
        raise InterfaceError("unsupported_format", f"a WAV of {width * 8}-bit samples at {rate} Hz is not read; "
                                                   f"{_CONVERT}")
    samples = _mono(_to_16bit(frames, width), channels)
    return _resample(samples, rate).tobytes() if rate != RATE else samples.tobytes()


def _to_16bit(frames: bytes, width: int) -> array.array[int]:
    """Signed 16-bit samples from 8-bit (unsigned), 16-, 24- or 32-bit (signed) little-endian PCM."""
    if width == 2:
        out = array.array("h")
        out.frombytes(frames[: len(frames) // 2 * 2])
        if sys.byteorder == "big":
            out.byteswap()
        return out
    if width == 1:
        return array.array("h", ((b - 128) << 8 for b in frames))
    return array.array("h", (int.from_bytes(frames[i + width - 2:i + width], "little", signed=True)
                             for i in range(0, len(frames) - width + 1, width)))


def _mono(samples: array.array[int], channels: int) -> array.array[int]:
    if channels == 1:
        return samples
    count = len(samples) // channels
    return array.array("h", (sum(samples[i * channels:(i + 1) * channels]) // channels for i in range(count)))


def _resample(samples: array.array[int], rate: int) -> array.array[int]:
    """`samples` at `rate` resampled to 16 kHz: averaged over each output step (a box filter against aliasing)
    when shrinking, linearly interpolated when growing."""
    count = int(len(samples) * RATE / rate)
    step = rate / RATE
    out = array.array("h", bytes(2 * count))
    last = len(samples) - 1
    for i in range(count):
        position = i * step
        if step > 1:
            start, end = int(position), min(int(position + step), last + 1)
            window = samples[start:max(end, start + 1)]
            out[i] = sum(window) // len(window)
        else:
            low = int(position)
            high = min(low + 1, last)
            fraction = position - low
            out[i] = int(samples[low] * (1 - fraction) + samples[high] * fraction)
    return out


class Engine:
    """One PocketSphinx decoder (it is not thread-safe: calls take turns), and recent results by file hash."""

    def __init__(self) -> None:
        from pocketsphinx import Decoder  # the model loads here, before the server answers `initialize`

        self._decoder: Any = Decoder(samprate=RATE, loglevel="FATAL")
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def transcribe(self, path: Path, language: str | None) -> dict[str, Any]:
        if language not in (None, "en"):
            raise InterfaceError("unavailable", f"this service transcribes English (en) only, not '{language}', "
                                 "and calling it again with that language will not help: leave language out or "
                                 "give 'en' for English audio, or tell the user", retry="never")
        data = path.read_bytes()
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            output = self._decode(read_pcm(data))
            self._cache[key] = output
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
            return output

    def _decode(self, pcm: bytes) -> dict[str, Any]:
        if not has_speech(pcm):  # the recognizer would find words in silence or noise
            return {"text": "", "language": "en"}
        decoder = self._decoder
        decoder.start_utt()
        decoder.process_raw(pcm, no_search=False, full_utt=True)
        decoder.end_utt()
        words = [(_ALTERNATE.sub("", s.word), s.start_frame, s.end_frame) for s in decoder.seg()]
        segments = segments_of(words)
        text = " ".join(s["text"] for s in segments)
        output: dict[str, Any] = {"text": text, "language": "en"}
        if segments:
            output["segments"] = segments
        return output


def has_speech(pcm: bytes) -> bool:
    """Whether PocketSphinx's voice activity detector hears at least MIN_SPEECH_SECONDS of speech."""
    from pocketsphinx import Vad

    vad = Vad()
    size = vad.frame_bytes
    needed = MIN_SPEECH_SECONDS / vad.frame_length
    heard = 0
    for start in range(0, len(pcm) - size + 1, size):
        heard += vad.is_speech(pcm[start:start + size])
        if heard >= needed:
            return True
    return False


def segments_of(words: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    """Timed segments from the decoder's words and silences (frames of 10 ms), split at pauses."""
    segments: list[dict[str, Any]] = []
    current: list[tuple[str, int, int]] = []
    for word, start, end in words:
        silent = word.startswith(("<", "[")) or word == "</s>"
        if silent:
            if current and end - start + 1 >= PAUSE_FRAMES:
                segments.append(_segment(current))
                current = []
            continue
        current.append((word, start, end))
    if current:
        segments.append(_segment(current))
    return segments


def _segment(words: list[tuple[str, int, int]]) -> dict[str, Any]:
    return {"start": round(words[0][1] / FRAMES_PER_SECOND, 2), "end": round((words[-1][2] + 1) / FRAMES_PER_SECOND, 2),
            "text": " ".join(w for w, _, _ in words)}


def transcribe_audio(engine: Engine) -> Handler:
    async def handle(args: dict[str, Any]) -> Reply:
        output = await anyio.to_thread.run_sync(engine.transcribe, Path(args["path"]), args.get("language"))
        return Reply(output, output["text"])

    return handle


def main() -> None:
    serve("transcribe/v1", "transcribe-pocketsphinx", {"transcribe_audio": transcribe_audio(Engine())},
          failed="the speech recognizer failed on this file; retrying later may work")


if __name__ == "__main__":
    main()
