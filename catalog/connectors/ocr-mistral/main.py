"""ocr-mistral: the ocr/v1 connector on Mistral's OCR API, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `ocr_extract` with `path` naming
a copy of the agent's file in the call's own folder. The file's type comes from its first bytes
(PDF, PNG, JPEG, TIFF, WebP, GIF, AVIF); anything else is the interface error `unsupported_format`
and nothing is sent. The file goes to `POST /v1/ocr` as a base64 data URL; each page of the answer
becomes one page of the result, its text being Mistral's markdown. Mistral gives no boxes, so the
pages carry no blocks (they are optional in ocr/v1).

Secrets and settings (environment): MISTRAL_API_KEY; MISTRAL_OCR_MODEL ("mistral-ocr-latest").
Outbound traffic goes through the proxy the router sets in the environment (httpx honours it).
"""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path
from typing import Any

import httpx
from handler_kit import Handler, InterfaceError, Reply, needs_a_person, serve

log = logging.getLogger("ocr-mistral")

BASE_URL = "https://api.mistral.ai"  # tests point this at a loopback stand-in
DEFAULT_MODEL = "mistral-ocr-latest"
MAX_FILE_BYTES = 20_000_000  # ocr/v1's limits.maxFileBytes
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # what is read of Mistral's answer, at most
MAX_PAGES = 2000
TIMEOUT = httpx.Timeout(110.0, connect=10.0)  # under ocr/v1's limits.timeoutSeconds (120)
_RETRY_AFTER_MAX = 86_400


# The types Mistral's OCR reads, by the file's first bytes; anything else is refused before any call.
_MAGIC = (
    (b"%PDF-", "application/pdf"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
    (b"II*\x00", "image/tiff"), (b"MM\x00*", "image/tiff"), (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"),
)


def sniff(head: bytes) -> str | None:
    """The file's MIME type from its first bytes (never from its name: agents rename files), or None."""
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head[4:12] in (b"ftypavif", b"ftypavis"):
        return "image/avif"
    return None


def read_document(path: Path) -> tuple[bytes, str]:
    """The file's bytes and MIME type, or the interface error saying why it cannot be sent."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InterfaceError("too_large", f"the file is {size} bytes; the limit is {MAX_FILE_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise InterfaceError("unsupported_format", f"the file could not be read: {exc.strerror}") from None
    mime = sniff(data[:16])
    if mime is None:
        raise InterfaceError("unsupported_format", "the file is not a PDF or an image (PNG, JPEG, TIFF, GIF, "
                             "WebP, AVIF); if it is an archive, extract the document first")
    return data, mime


def request_body(data: bytes, mime: str, model: str) -> dict[str, Any]:
    url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    if mime == "application/pdf":
        document = {"type": "document_url", "document_url": url}
    else:
        document = {"type": "image_url", "image_url": url}
    return {"model": model, "document": document}


def retry_after(headers: httpx.Headers) -> str:
    """'in N seconds' from a Retry-After in seconds, else 'later' (a date or junk is not repeated)."""
    value = headers.get("retry-after", "").strip()
    if value.isdigit() and int(value) <= _RETRY_AFTER_MAX:
        return f"in {int(value)} seconds"
    return "later"


def check_status(response: httpx.Response) -> None:
    """Map an unsuccessful status onto `unavailable`, in our words (Mistral's body is not repeated)."""
    status = response.status_code
    if 200 <= status < 300:
        return
    if status in (401, 403):
        raise needs_a_person("Mistral refused the API key (revoked, expired or without access to OCR); the "
                             "operator must provision a new one")
    if status == 413:
        raise InterfaceError("too_large", "Mistral refused the file as too large")
    if status == 429:
        raise InterfaceError("unavailable", f"Mistral's rate limit or quota was reached; retry "
                             f"{retry_after(response.headers)} (Retry-After)")
    if status >= 500:
        raise InterfaceError("unavailable", f"Mistral's OCR service failed (HTTP {status}); retrying later may "
                             "work")
    log.warning("Mistral answered HTTP %s", status)
    raise needs_a_person(f"Mistral did not accept the request (HTTP {status}); the operator must check the binding")


async def post(url: str, api_key: str, body: dict[str, Any]) -> bytes:
    """POST the JSON body; the answer's bytes (at most MAX_ANSWER_BYTES), or `unavailable`."""
    headers = {"authorization": f"Bearer {api_key}", "accept": "application/json"}
    try:
        async with (httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False) as client,
                    client.stream("POST", url, json=body, headers=headers) as response):
            check_status(response)
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise InterfaceError("unavailable", "Mistral's answer was larger than this connector "
                                         "accepts, and it will be again for this document: split it into "
                                         "documents of fewer pages", retry="never")
                chunks.append(chunk)
            return b"".join(chunks)
    except httpx.TimeoutException:
        raise InterfaceError("unavailable", "Mistral's OCR service did not answer in time; retrying later "
                             "may work") from None
    except httpx.HTTPError as exc:
        log.warning("request to Mistral failed: %s", type(exc).__name__)
        raise InterfaceError("unavailable", "Mistral's OCR service could not be reached; retrying later may "
                             "work") from None


def pages_from_answer(raw: bytes) -> list[dict[str, Any]]:
    """ocr/v1 pages from Mistral's answer, in page order; a malformed answer is `unavailable`."""
    malformed = InterfaceError("unavailable", "Mistral's OCR service sent an answer this connector cannot read; "
                               "retrying later may work")
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        raise malformed from None
    pages = answer.get("pages") if isinstance(answer, dict) else None
    if not isinstance(pages, list) or len(pages) > MAX_PAGES:
        raise malformed
    ordered: list[tuple[int, str]] = []
    for position, page in enumerate(pages):
        if not isinstance(page, dict) or not isinstance(page.get("markdown"), str):
            raise malformed
        index = page.get("index")
        ordered.append((index if isinstance(index, int) and not isinstance(index, bool) else position,
                        page["markdown"]))
    ordered.sort(key=lambda item: item[0])
    return [{"text": text} for _, text in ordered]


async def extract(path: Path, api_key: str, model: str = DEFAULT_MODEL) -> dict[str, Any]:
    """ocr_extract's output for the file at `path`, or an InterfaceError of ocr/v1's list."""
    data, mime = read_document(path)
    if not api_key:
        raise needs_a_person("no Mistral API key is configured; the operator must provision one")
    raw = await post(f"{BASE_URL}/v1/ocr", api_key, request_body(data, mime, model or DEFAULT_MODEL))
    return {"pages": pages_from_answer(raw)}


def ocr_extract(api_key: str, model: str) -> Handler:
    async def handle(args: dict[str, Any]) -> Reply:
        output = await extract(Path(args["path"]), api_key, model)
        return Reply(output, "\n\f\n".join(page["text"] for page in output["pages"]))

    return handle


def main() -> None:
    api_key = os.environ.get("MISTRAL_API_KEY", "").strip()
    model = os.environ.get("MISTRAL_OCR_MODEL", "").strip() or DEFAULT_MODEL
    serve("ocr/v1", "ocr-mistral", {"ocr_extract": ocr_extract(api_key, model)},
          problem="" if api_key else "MISTRAL_API_KEY is not set (see PROVISIONING.md)",
          failed="the OCR connector failed on this file; retrying later may work")


if __name__ == "__main__":
    main()
