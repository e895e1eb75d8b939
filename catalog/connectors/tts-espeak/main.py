"""tts-espeak: the tts/v1 connector on the host's eSpeak NG, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `tts_synthesize` with `outputPath`
naming a fresh file in the call's own folder; the connector writes the WAV there and the router moves
it into the agent's work folder at the path the agent chose. The text goes to `espeak-ng` on its
standard input (never through a shell, never as an option); the voice is checked for a safe shape and
then by the engine itself: a voice it does not know is the interface error `voice_unknown`.

Settings (environment): ESPEAK_VOICE, the voice used when a call names none ("en-us");
ESPEAK_SPEED, words per minute ("160").
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import wave
from pathlib import Path
from typing import Any

import anyio
from handler_kit import InterfaceError, needs_a_person, serve
from handler_kit.tts import describe_wav, run_engine, tts_synthesize

log = logging.getLogger("tts-espeak")

MAX_VOICE = 100  # and for `voice`
MAX_LISTING = 1 << 20  # what is read of `espeak-ng --voices`
MIN_SPEED, MAX_SPEED, DEFAULT_SPEED = 80, 450, 160
# What a voice name may look like: a language ("en-us"), a voice file ("gmw/en-US") or a voice's name
# ("English (America)"), optionally with a variant ("+f3"). Never an option, an absolute path or "..".
_VOICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_ (),./-]*(\+[A-Za-z0-9_-]+)?$")
_VOICE_MISSING = ("voice does not exist", "mbrola")


def speed_from(raw: str | None) -> int:
    """The words-per-minute setting, within what eSpeak NG handles; the default if it is not a number."""
    try:
        value = int((raw or "").strip())
    except ValueError:
        return DEFAULT_SPEED
    return max(MIN_SPEED, min(MAX_SPEED, value))


def names_in(listing: bytes) -> frozenset[str]:
    """Every name `espeak-ng --voices` lets a call use, lower-cased: each row's language, its voice's
    name (with spaces or underscores), its file (also without the folder) and its other languages."""
    names: set[str] = set()
    for line in listing.decode("utf-8", errors="replace").splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5:
            continue
        language, name, file = parts[1], parts[3], parts[4]
        names.update({language, name, name.replace("_", " "), file, file.rpartition("/")[2]})
        names.update(re.findall(r"\(([^\s()]+) \d+\)", " ".join(parts[5:])))
    return frozenset(n.lower() for n in names if n and n != "variant")


class Engine:
    """Runs `espeak-ng`, one process per call."""

    def __init__(self, voice: str, speed: int) -> None:
        self.voice = voice.strip() or "en-us"
        self.speed = speed
        self.installed = False
        self.voices: frozenset[str] = frozenset()  # lower-cased; empty if the engine listed none
        self.variants: frozenset[str] = frozenset()

    async def start(self) -> None:
        """Learn the voices and variants once: a name outside them is `voice_unknown`, since the engine
        itself quietly falls back to a near voice for many names it does not have ("no-such-voice")."""
        try:
            voices = await anyio.run_process(["espeak-ng", "--voices"], check=False)
            variants = await anyio.run_process(["espeak-ng", "--voices=variant"], check=False)
        except OSError as exc:  # not installed: serve anyway, every call says why it fails
            log.error("espeak-ng cannot run (%s); see PROVISIONING.md", exc)
            return
        self.installed = voices.returncode == 0
        self.voices = names_in(voices.stdout[:MAX_LISTING])
        self.variants = names_in(variants.stdout[:MAX_LISTING]) if variants.returncode == 0 else frozenset()
        log.info("espeak-ng ready: %d voice names, %d variant names, default %s at %d wpm",
                 len(self.voices), len(self.variants), self.voice, self.speed)

    def check_voice(self, voice: str) -> None:
        """Refuse a voice of an unsafe shape, or one `espeak-ng --voices` did not list (when it listed any)."""
        base, _, variant = voice.partition("+")
        if len(voice) > MAX_VOICE or ".." in voice or not _VOICE.match(voice):
            raise InterfaceError("voice_unknown", "that is not a voice name eSpeak NG offers; voice names look "
                                 "like 'en-us', 'fr' or 'de', optionally with a variant such as 'en-us+f3'")
        if self.voices and base.lower() not in self.voices:
            raise InterfaceError("voice_unknown", f"eSpeak NG has no voice named '{base}'; voice names look "
                                 "like 'en-us', 'fr' or 'de'; omit voice for the default one")
        if variant and self.variants and variant.lower() not in self.variants:
            raise InterfaceError("voice_unknown", f"eSpeak NG has no voice variant named '{variant}'; variants "
                                 "look like 'f3' or 'm1'")

    async def synthesize(self, text: str, output: Path, voice: str | None) -> dict[str, Any]:
        if not self.installed:
            raise needs_a_person("eSpeak NG is not installed on this machine; an administrator must install it")
        voice = voice if voice is not None else self.voice
        self.check_voice(voice)
        code, stderr = await run_engine(["espeak-ng", "-v", voice, "-s", str(self.speed), "-w", str(output),
                                       "--stdin"], text.encode("utf-8"))
        if code != 0:
            said = stderr.decode("utf-8", errors="replace").lower()
            if any(marker in said for marker in _VOICE_MISSING):
                raise InterfaceError("voice_unknown", f"eSpeak NG has no voice named '{voice}'; omit voice for "
                                     "the default one")
            log.error("espeak-ng exited with status %d", code)
            raise InterfaceError("unavailable", "the speech engine failed on this text, and it fails the same way "
                                 "each time: rephrase or shorten the text, or choose another voice",
                                 retry="never")
        return describe_wav(output, "espeak-ng")


def main() -> None:
    engine = Engine(os.environ.get("ESPEAK_VOICE", "en-us"), speed_from(os.environ.get("ESPEAK_SPEED")))
    serve("tts/v1", "tts-espeak", {"tts_synthesize": tts_synthesize(engine)}, start=engine.start,
          failed="the speech engine failed; retrying later may work")


if __name__ == "__main__":
    main()
