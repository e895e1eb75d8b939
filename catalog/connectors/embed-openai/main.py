"""embed-openai: the embed/v1 connector on an OpenAI-compatible `/v1/embeddings`, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `embed_texts`. The texts go in batches
(32 by default; text-embeddings-inference refuses larger ones unless told otherwise) as `POST
/v1/embeddings` with `model`, `input` (the batch's texts) and, when the binding sets it, `dimensions`. The
same request shape is served by OpenAI, Ollama, vLLM and text-embeddings-inference (TEI). Each answer's
`data[]` is put back in input order by its `index`; every vector must have the same length.

Failures map onto embed/v1's closed list: HTTP 429 is `limit`, with Retry-After when sent, unless it says
the account is out of quota (`insufficient_quota`, then `unavailable`); a text too long for the model (HTTP
413, as TEI answers, or a 400 about the model's context length, as OpenAI and vLLM answer) is `limit` too,
as embed/v1 says. A refused key, a timeout, a 5xx, or an answer that is not the expected JSON (a missing,
misordered or ragged vector) is `unavailable`. The service's own wording never reaches the result.

Settings (environment): EMBED_BASE_URL (https://api.openai.com by default), EMBED_MODEL, EMBED_DIMENSIONS
(optional), EMBED_BATCH (texts per request) and the secret EMBED_API_KEY (optional for a local server).
Outbound traffic goes through the proxy the router sets in the environment (httpx honours it).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
import struct
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from handler_kit import Handler, InterfaceError, Reply, needs_a_person, serve

log = logging.getLogger("embed-openai")

DEFAULT_BASE_URL = "https://api.openai.com"
EMBEDDINGS_PATH = "/v1/embeddings"
CALL_SECONDS = 55.0  # every batch of a call, under embed/v1's limits.timeoutSeconds (60)
TIMEOUT = httpx.Timeout(50.0, connect=10.0)
MAX_TEXTS = 64  # the most texts a call of embed/v1 sends, so the most a batch need hold
DEFAULT_BATCH = 32
MAX_BODY = 64 * 1024 * 1024  # bytes read of an answer at most: 64 vectors of a few thousand floats as JSON
MAX_ERROR_BODY = 64 * 1024  # bytes read of an error answer, to tell a too-long text from another refusal
_RETRY_AFTER_MAX = 86_400
# Words of an HTTP 400's error that say a text was over the model's input length (OpenAI, vLLM); only used to
# choose `limit` over `unavailable`, never repeated.
_TOO_LONG = ("context length", "context_length", "too long", "maximum input", "max_tokens", "token limit")


MALFORMED = "the embedding service sent an answer this connector cannot read; retrying later may work"


def check_base_url(value: str) -> str | None:
    """Why EMBED_BASE_URL cannot be used, or None: an http(s) address without a login, query or fragment."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"EMBED_BASE_URL must be an http:// or https:// address (got {value!r})"
    if parts.username or parts.password or parts.query or parts.fragment:
        return "EMBED_BASE_URL must not hold a login, a query or a fragment; the key goes in EMBED_API_KEY"
    return None


def whole_number(env: dict[str, str] | os._Environ[str], name: str, low: int, high: int) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or not low <= int(value) <= high:
        log.error("%s must be a whole number from %d to %d; it is ignored", name, low, high)
        return None
    return int(value)


@dataclass(frozen=True)
class Settings:
    model: str
    api_key: str | None = None
    base_url: str = DEFAULT_BASE_URL
    dimensions: int | None = None
    batch: int = DEFAULT_BATCH

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> Settings:
        return cls(model=env.get("EMBED_MODEL", "").strip(), api_key=env.get("EMBED_API_KEY", "").strip() or None,
                   base_url=(env.get("EMBED_BASE_URL", "").strip() or DEFAULT_BASE_URL).rstrip("/"),
                   dimensions=whole_number(env, "EMBED_DIMENSIONS", 1, 65536),
                   batch=whole_number(env, "EMBED_BATCH", 1, MAX_TEXTS) or DEFAULT_BATCH)


def retry_after(headers: httpx.Headers) -> str:
    """'retry after N seconds' from a Retry-After in seconds, else a plain 'wait' (a date or junk is not repeated)."""
    value = headers.get("retry-after", "").strip()
    if value.isdigit() and int(value) <= _RETRY_AFTER_MAX:
        return f"retry after {int(value)} seconds"
    return "wait a little before retrying"


def error_words(body: bytes) -> str:
    """The error answer's code, type and message, lower-cased: read to classify, never repeated."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        return body[:2000].decode("utf-8", "replace").lower()
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        return " ".join(str(error.get(k) or "") for k in ("code", "type", "message")).lower()
    return str(error or answer)[:2000].lower()


def refusal(status: int, headers: httpx.Headers, words: str) -> InterfaceError:
    """The interface error for an answer that is not 200, from its status, headers and error words."""
    if status in (401, 403):
        return needs_a_person(f"the embedding service refused the API key (HTTP {status}); the binding's key is "
                              "wrong, revoked or without access to embeddings, and an administrator must replace it")
    if "insufficient_quota" in words:
        return needs_a_person("the embedding service's quota or credit for this key is used up; embedding will work "
                              "again once an administrator tops the account up")
    if status == 429:
        return InterfaceError("limit", f"the embedding service's rate limit was reached; {retry_after(headers)}")
    if status == 413 or (status == 400 and any(w in words for w in _TOO_LONG)):
        return InterfaceError("limit", "a text is longer than the model accepts (or the batch too large); shorten "
                              "or split the longest texts and send smaller batches")
    if status >= 500:
        return InterfaceError("unavailable", f"the embedding service is failing (HTTP {status}); retrying later "
                              "may work")
    log.warning("the embedding service answered HTTP %s", status)
    return needs_a_person(f"the embedding service did not accept the request (HTTP {status}); the binding's model "
                          "may be wrong, and an administrator must check it")


async def read_bounded(response: httpx.Response, limit: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise InterfaceError("unavailable", "the embedding service's answer was far larger than the vectors "
                                 "asked for")
    return bytes(body)


def request_body(texts: list[str], settings: Settings) -> dict[str, Any]:
    body: dict[str, Any] = {"model": settings.model, "input": texts}
    if settings.dimensions:
        body["dimensions"] = settings.dimensions
    return body


async def post(client: httpx.AsyncClient, body: dict[str, Any], settings: Settings) -> bytes:
    """POST one batch; the answer's bytes (bounded), or an InterfaceError."""
    headers = {"accept": "application/json"}
    if settings.api_key:
        headers["authorization"] = f"Bearer {settings.api_key}"
    try:
        async with client.stream("POST", settings.base_url + EMBEDDINGS_PATH, json=body, headers=headers) as response:
            if response.status_code != 200:
                words = error_words(await read_bounded(response, MAX_ERROR_BODY))
                raise refusal(response.status_code, response.headers, words)
            return await read_bounded(response, MAX_BODY)
    except httpx.TimeoutException:
        raise InterfaceError("unavailable", "the embedding service did not answer in time; retrying later may "
                             "work") from None
    except httpx.HTTPError as exc:
        log.warning("request to the embedding service failed: %s", type(exc).__name__)
        raise InterfaceError("unavailable", "the embedding service could not be reached; retrying later may "
                             "work") from None


def vector_of(value: Any) -> list[float]:
    """One embedding: a list of finite numbers, or base64 of little-endian float32 (encoding_format=base64)."""
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InterfaceError("unavailable", MALFORMED) from None
        if not raw or len(raw) % 4:
            raise InterfaceError("unavailable", MALFORMED)
        value = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if not isinstance(value, list) or not value or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value):
        raise InterfaceError("unavailable", MALFORMED)
    return [float(x) for x in value]


def vectors_from_answer(raw: bytes, count: int) -> list[list[float]]:
    """The answer's vectors in input order; a count, an index or a vector out of shape is `unavailable`."""
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        raise InterfaceError("unavailable", MALFORMED) from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or len(data) != count:
        raise InterfaceError("unavailable", MALFORMED)
    placed: dict[int, list[float]] = {}
    for position, item in enumerate(data):
        if not isinstance(item, dict):
            raise InterfaceError("unavailable", MALFORMED)
        index = item.get("index", position)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count or index in placed:
            raise InterfaceError("unavailable", MALFORMED)
        placed[index] = vector_of(item.get("embedding"))
    return [placed[i] for i in range(count)]


async def embed(texts: list[str], settings: Settings) -> dict[str, Any]:
    """embed_texts' output for `texts`, batch after batch; or an InterfaceError."""
    problem = check_base_url(settings.base_url)
    if problem or not settings.model:
        raise needs_a_person("this binding is not usable: " + (problem or "EMBED_MODEL is not set; the binding must "
                             "name the model, e.g. text-embedding-3-small"))
    vectors: list[list[float]] = []
    try:
        with anyio.fail_after(CALL_SECONDS):
            async with httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False) as client:
                for start in range(0, len(texts), settings.batch):
                    batch = texts[start:start + settings.batch]
                    raw = await post(client, request_body(batch, settings), settings)
                    vectors.extend(vectors_from_answer(raw, len(batch)))
    except TimeoutError:
        raise InterfaceError("unavailable", "the embedding service did not answer in time; retrying later may "
                             "work") from None
    if len({len(v) for v in vectors}) != 1:
        raise InterfaceError("unavailable", "the embedding service sent vectors of different lengths; retrying "
                             "later may work")
    return {"vectors": vectors, "dimensions": len(vectors[0])}


def embed_texts(settings: Settings) -> Handler:
    async def handle(args: dict[str, Any]) -> Reply:
        output = await embed(args["texts"], settings)
        return Reply(output, f"{len(output['vectors'])} vectors of {output['dimensions']} dimensions")

    return handle


def main() -> None:
    settings = Settings.from_env(os.environ)
    problem = check_base_url(settings.base_url) or ("" if settings.model else "EMBED_MODEL is not set")
    serve("embed/v1", "embed-openai", {"embed_texts": embed_texts(settings)}, problem=problem,
          failed="embedding failed unexpectedly; retrying later may work")


if __name__ == "__main__":
    main()
