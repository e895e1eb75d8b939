"""tts-festival: the tts/v1 connector on the host's Festival, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `tts_synthesize` with `outputPath`
naming a fresh file in the call's own folder; the connector writes the WAV there and the router moves
it into the agent's work folder at the path the agent chose. The text goes to Festival's `text2wave` on
its standard input (never through a shell, never as an option or as Scheme); the only Scheme it is
given is `(voice_NAME)`, for a NAME Festival itself listed. The shipped voice, cmu_us_slt (an HTS
voice), reads US English: the text is reduced to what that voice can say (accents dropped, letters of
other scripts left out), and a text with nothing left to say is a WAV of silence.

Settings (environment): FESTIVAL_VOICE, the voice used when a call names none
("cmu_us_slt_arctic_hts"); FESTIVAL_SAMPLE_RATE, the WAV's rate in Hz ("16000").
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import unicodedata
import wave
from pathlib import Path
from typing import Any

import anyio
from handler_kit import InterfaceError, needs_a_person, serve
from handler_kit.tts import describe_wav, run_engine, tts_synthesize

log = logging.getLogger("tts-festival")

MAX_VOICE = 100  # and for `voice`
MAX_LISTING = 1 << 16  # what is read of Festival's voice list
MIN_RATE, MAX_RATE, DEFAULT_RATE = 8000, 48000, 16000
DEFAULT_VOICE = "cmu_us_slt_arctic_hts"
# A Festival voice is a Scheme symbol `voice_<name>`; only names of this shape are ever put into Scheme.
_VOICE = re.compile(r"^[a-z0-9_]+$")


def rate_from(raw: str | None) -> int:
    """The sample-rate setting, within what a WAV for speech needs; the default if it is not a number."""
    try:
        value = int((raw or "").strip())
    except ValueError:
        return DEFAULT_RATE
    return max(MIN_RATE, min(MAX_RATE, value))


def speakable(text: str) -> str:
    """What of `text` an English Festival voice can read: accents taken off their letters ("café" is
    read "cafe"), every other character outside printable ASCII (other scripts, symbols, control
    characters) made a space. Festival reads bytes as Latin-1 and chokes on some of them."""
    kept = []
    for char in unicodedata.normalize("NFKD", text):
        if " " <= char <= "~" or char == "\n":
            kept.append(char)
        elif not unicodedata.combining(char):
            kept.append(" ")
    return "".join(kept)


def voices_in(listing: bytes) -> frozenset[str]:
    """The voice names in what `(print (voice.list))` printed: `(cmu_us_slt_arctic_hts kal_diphone)`."""
    found = re.search(r"\(([a-z0-9_ ]*)\)", listing.decode("utf-8", errors="replace"))
    return frozenset(found.group(1).split()) if found else frozenset()


class Engine:
    """Runs `text2wave`, one process per call."""

    def __init__(self, voice: str, rate: int) -> None:
        self.voice = voice.strip() or DEFAULT_VOICE
        self.rate = rate
        self.installed = False
        self.voices: frozenset[str] = frozenset()

    async def start(self) -> None:
        """Learn the installed voices once: a name outside them is `voice_unknown` (Festival itself
        would stop on an unbound Scheme symbol and still exit 0)."""
        try:
            listed = await anyio.run_process(["festival", "--batch", "(print (voice.list))"], check=False)
        except OSError as exc:  # not installed: serve anyway, every call says why it fails
            log.error("festival cannot run (%s); see PROVISIONING.md", exc)
            return
        self.voices = voices_in(listed.stdout[:MAX_LISTING])
        self.installed = listed.returncode == 0 and bool(self.voices)
        if self.installed and self.voice not in self.voices:
            log.error("the default voice %s is not installed; Festival has %s", self.voice, sorted(self.voices))
        log.info("festival ready: voices %s, default %s, %d Hz", sorted(self.voices), self.voice, self.rate)

    def choose_voice(self, voice: str | None) -> str:
        """The voice a call gets: the one it named, if Festival has it, else the binding's default."""
        if voice is None:
            if self.voice not in self.voices:
                raise InterfaceError("unavailable", f"this service's default voice '{self.voice[:MAX_VOICE]}' is "
                                     "not installed, so a call without a voice fails every time: name one of "
                                     f"{', '.join(sorted(self.voices))}, and tell the user that an administrator "
                                     "must install the default voice or change the binding", retry="never")
            return self.voice
        if voice not in self.voices or not _VOICE.match(voice):
            offered = ", ".join(sorted(self.voices))
            named = f"no voice named '{voice}'" if _VOICE.match(voice) else "no voice by that name"
            raise InterfaceError("voice_unknown", f"Festival here has {named}; it offers: {offered}; omit "
                                 "voice for the default one")
        return voice

    async def synthesize(self, text: str, output: Path, voice: str | None) -> dict[str, Any]:
        if not self.installed:
            raise needs_a_person("Festival or its voices are not installed on this machine; an administrator must "
                                 "install them")
        chosen = self.choose_voice(voice)
        words = speakable(text)
        if not any(char.isalnum() for char in words):  # Festival writes no file at all for these
            write_silence(output, self.rate)
            return describe_wav(output, "text2wave")
        code, stderr = await run_engine(["text2wave", "-eval", f"(voice_{chosen})", "-F", str(self.rate),
                                       "-otype", "riff", "-o", str(output)], words.encode("ascii"))
        if code != 0 or b"SIOD ERROR" in stderr:  # Festival exits 0 after many of its errors
            log.error("text2wave failed (status %d): %s", code, stderr[-500:].decode("utf-8", errors="replace"))
            output.unlink(missing_ok=True)
            raise InterfaceError("unavailable", "the speech engine failed on this text, and it fails the same way "
                                 "each time: rephrase it in plainer words, or choose another voice", retry="never")
        return describe_wav(output, "text2wave")


def write_silence(path: Path, rate: int) -> None:
    """A valid WAV with no frames: what a text with nothing to say sounds like."""
    with wave.open(str(path), "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(rate)
        audio.writeframes(b"")


def main() -> None:
    engine = Engine(os.environ.get("FESTIVAL_VOICE", DEFAULT_VOICE), rate_from(os.environ.get("FESTIVAL_SAMPLE_RATE")))
    serve("tts/v1", "tts-festival", {"tts_synthesize": tts_synthesize(engine)}, start=engine.start,
          failed="the speech engine failed; retrying later may work")


if __name__ == "__main__":
    main()
