"""ocr-tesseract: the ocr/v1 connector on the host's Tesseract, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `ocr_extract` with `path` naming
a copy of the agent's file in the call's own folder. PDFs are rasterized one page at a time with
Poppler's `pdftoppm`; each page image goes through `tesseract ... tsv`, from which come both the
page's text and its blocks (text with a pixel bbox x0, y0, x1, y1). A file that is neither a PDF
nor an image Tesseract reads is the interface error `unsupported_format`.

Settings (environment): OCR_LANGUAGES, the packs used when a call names none ("eng+fra").
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import re
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import anyio
from handler_kit import Handler, InterfaceError, Reply, serve

log = logging.getLogger("ocr-tesseract")

DPI = 300
# Two-letter codes (ISO 639-1) a call may name → Tesseract's packs (ISO 639-2/T, Tesseract's spelling).
PACKS = {
    "af": "afr", "ar": "ara", "bg": "bul", "ca": "cat", "cs": "ces", "da": "dan", "de": "deu", "el": "ell",
    "en": "eng", "es": "spa", "et": "est", "eu": "eus", "fa": "fas", "fi": "fin", "fr": "fra", "ga": "gle",
    "gl": "glg", "he": "heb", "hi": "hin", "hr": "hrv", "hu": "hun", "id": "ind", "is": "isl", "it": "ita",
    "ja": "jpn", "ko": "kor", "lt": "lit", "lv": "lav", "nl": "nld", "no": "nor", "pl": "pol", "pt": "por",
    "ro": "ron", "ru": "rus", "sk": "slk", "sl": "slv", "sq": "sqi", "sr": "srp", "sv": "swe", "th": "tha",
    "tr": "tur", "uk": "ukr", "vi": "vie", "zh": "chi_sim",
}
# What Tesseract (through Leptonica) reads, by the file's first bytes; anything else is refused.
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"II*\x00", b"MM\x00*", b"GIF87a", b"GIF89a", b"BM")
_PNM = re.compile(rb"^P[1-6]\s")
_CACHE_SIZE = 64
_BLOCK, _WORD = 2, 5  # the `level` column of Tesseract's TSV


def sniff(head: bytes) -> str | None:
    """'pdf', 'image' or None, from a file's first bytes (never from its name: agents rename files)."""
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith(_IMAGE_MAGIC) or _PNM.match(head):
        return "image"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image"
    return None


class Engine:
    """Runs Poppler and Tesseract; remembers recent results by the file's hash and the languages."""

    def __init__(self, default_languages: str) -> None:
        self.default = default_languages or "eng"
        self.installed: frozenset[str] = frozenset()
        self._cache: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        # One thread per OCR process: the router may send several calls at once, and Tesseract's
        # OpenMP threads fighting each other are slower than one each.
        self.env = {**os.environ, "OMP_THREAD_LIMIT": "1"}

    async def start(self) -> None:
        try:
            done = await anyio.run_process(["tesseract", "--list-langs"], check=False, env=self.env)
        except OSError as exc:  # not installed: serve anyway, every call says why it fails
            log.error("tesseract cannot run (%s); see PROVISIONING.md", exc)
            return
        lines = done.stdout.decode(errors="replace").splitlines()[1:]
        self.installed = frozenset(line.strip() for line in lines if line.strip())
        log.info("tesseract packs installed: %s", ", ".join(sorted(self.installed)) or "none")

    def packs_for(self, languages: list[str] | None) -> str:
        """The '+'-joined packs for a call's two-letter codes; installed ones only, else the setting."""
        chosen: list[str] = []
        for code in languages or ():
            pack = PACKS.get(code)
            if pack and pack in self.installed and pack not in chosen:
                chosen.append(pack)
        return "+".join(chosen) if chosen else self.default

    async def extract(self, path: Path, languages: list[str] | None) -> dict[str, Any]:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InterfaceError("unsupported_format", f"the file could not be read: {exc.strerror}") from None
        kind = sniff(data[:16])
        if kind is None:
            raise InterfaceError("unsupported_format", "the file is not a PDF or an image (PNG, JPEG, TIFF, GIF, "
                                 "BMP, WebP, PNM); if it is an archive, extract the document first")
        packs = self.packs_for(languages)
        key = (hashlib.sha256(data).hexdigest(), packs)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        with tempfile.TemporaryDirectory(prefix="ocr-") as tmp:
            if kind == "pdf":
                pages = [await self.ocr_image(image, packs) async for image in self.rasterize(path, Path(tmp))]
            else:
                pages = [await self.ocr_image(path, packs)]
        result = {"pages": pages}
        self._cache[key] = result
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return result

    async def rasterize(self, pdf: Path, tmp: Path) -> Any:
        """Each page of the PDF as a PNG, one page at a time (memory stays at one page)."""
        info = await anyio.run_process(["pdfinfo", str(pdf)], check=False, env=self.env)
        found = re.search(rb"^Pages:\s+(\d+)", info.stdout, re.MULTILINE)
        if info.returncode != 0 or found is None:
            raise InterfaceError("unsupported_format", "the file starts like a PDF but Poppler cannot read it "
                                 "(damaged or encrypted)")
        for page in range(1, int(found[1]) + 1):
            prefix = tmp / f"page-{page}"
            done = await anyio.run_process(
                ["pdftoppm", "-r", str(DPI), "-png", "-singlefile", "-f", str(page), "-l", str(page), str(pdf),
                 str(prefix)], check=False, env=self.env)
            image = prefix.with_suffix(".png")
            if done.returncode != 0 or not image.exists():
                raise InterfaceError("unsupported_format", f"Poppler could not rasterize page {page} of the PDF")
            yield image
            image.unlink()

    async def ocr_image(self, image: Path, packs: str) -> dict[str, Any]:
        done = await anyio.run_process(["tesseract", str(image), "stdout", "-l", packs, "tsv"], check=False,
                                       env=self.env)
        if done.returncode != 0:
            message = done.stderr.decode(errors="replace").strip().splitlines()
            if any("Error in pixRead" in line or "Unsupported image" in line for line in message):
                raise InterfaceError("unsupported_format", "the image could not be decoded")
            raise RuntimeError(f"tesseract failed ({done.returncode}): {' / '.join(message[-3:])}")
        return page_from_tsv(done.stdout.decode("utf-8", errors="replace"))


def page_from_tsv(tsv: str) -> dict[str, Any]:
    """A page's text and blocks from Tesseract's TSV: words joined into lines, lines into blocks."""
    blocks: dict[int, dict[str, Any]] = {}
    lines: dict[tuple[int, int, int], list[str]] = {}
    for row in csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE):
        try:
            level, block = int(row["level"]), int(row["block_num"])
            box = [int(row["left"]), int(row["top"]), int(row["width"]), int(row["height"])]
        except (KeyError, TypeError, ValueError):
            continue
        if level == _BLOCK:
            blocks[block] = {"bbox": [box[0], box[1], box[0] + box[2], box[1] + box[3]], "lines": []}
        elif level == _WORD and (word := (row.get("text") or "").strip()):
            lines.setdefault((block, int(row["par_num"]), int(row["line_num"])), []).append(word)
    for (block, _, _), words in sorted(lines.items()):
        if block in blocks:
            blocks[block]["lines"].append(" ".join(words))
    out = [{"text": "\n".join(b["lines"]), "bbox": b["bbox"]} for _, b in sorted(blocks.items()) if b["lines"]]
    return {"text": "\n\n".join(b["text"] for b in out), "blocks": out}


def ocr_extract(engine: Engine) -> Handler:
    async def handle(args: dict[str, Any]) -> Reply:
        output = await engine.extract(Path(args["path"]), args.get("languages"))
        return Reply(output, "\n\f\n".join(page["text"] for page in output["pages"]))

    return handle


def main() -> None:
    engine = Engine(os.environ.get("OCR_LANGUAGES", "eng"))
    serve("ocr/v1", "ocr-tesseract", {"ocr_extract": ocr_extract(engine)}, start=engine.start,
          failed="the OCR engine failed on this file; retrying later may work")


if __name__ == "__main__":
    main()
