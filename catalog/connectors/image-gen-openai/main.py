"""image-gen-openai: the image-gen/v1 connector on an OpenAI-compatible images endpoint, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `image_gen_generate` with `outputPath`
naming a fresh file in the call's own folder; the router moves what is written there into the agent's
work folder at the path the agent chose. Each call is one `POST /v1/images/generations` (`model`,
`prompt`, `n` = 1, `size`, `response_format` = `b64_json`) to OpenAI or any server speaking its images
API; the answer's `data[0].b64_json` is decoded, checked to be a PNG, and written. The width and height
returned are read from the PNG itself, never assumed from the size asked.

Failures map onto image-gen/v1's closed list: a prompt declined by the content policy (HTTP 400 with
the code `content_policy_violation` or `moderation_blocked`) is `refused`; HTTP 429 is `limit`, with
Retry-After when sent, unless it says the account is out of quota (`insufficient_quota`), which is
`unavailable` like a refused key, a timeout, a 5xx, an answer that is not a PNG in the expected JSON, or
a size the binding does not offer. The service's own wording never reaches the result.

Settings (environment): IMAGE_GEN_BASE_URL (https://api.openai.com by default), IMAGE_GEN_MODEL,
IMAGE_GEN_SIZES (the sizes the model makes, comma-separated), IMAGE_GEN_RESPONSE_FORMAT (`b64_json`, or
`none` for servers that always answer base64 and refuse the parameter) and the secret IMAGE_GEN_API_KEY.
Outbound traffic goes through the proxy the router sets in the environment (httpx honours it).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from handler_kit import Handler, InterfaceError, Reply, needs_a_person, serve

log = logging.getLogger("image-gen-openai")

DEFAULT_BASE_URL = "https://api.openai.com"
GENERATIONS_PATH = "/v1/images/generations"
SIZES = ("256x256", "512x512", "1024x1024")
DEFAULT_SIZE = "1024x1024"
TIMEOUT = httpx.Timeout(170.0, connect=10.0)  # under image-gen/v1's limits.timeoutSeconds (180)
MAX_BODY = 48 * 1024 * 1024  # bytes read of an answer at most: one large PNG in base64
MAX_ERROR_BODY = 64 * 1024  # bytes read of an error answer, for its error code only
_RETRY_AFTER_MAX = 86_400
_PNG = b"\x89PNG\r\n\x1a\n"
_REFUSED_CODES = ("content_policy_violation", "moderation_blocked")
_OTHER_IMAGES = ((b"\xff\xd8\xff", "JPEG"), (b"RIFF", "WebP"), (b"GIF8", "GIF"))


def check_base_url(value: str) -> str | None:
    """Why IMAGE_GEN_BASE_URL cannot be used, or None: an http(s) address without a login, query or fragment."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"IMAGE_GEN_BASE_URL must be an http:// or https:// address (got {value!r})"
    if parts.username or parts.password or parts.query or parts.fragment:
        return "IMAGE_GEN_BASE_URL must not hold a login, a query or a fragment; the key goes in IMAGE_GEN_API_KEY"
    return None


@dataclass(frozen=True)
class Settings:
    model: str
    api_key: str | None = None
    base_url: str = DEFAULT_BASE_URL
    sizes: tuple[str, ...] = SIZES
    response_format: bool = True  # send response_format = b64_json

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> Settings:
        sizes = tuple(s.strip() for s in env.get("IMAGE_GEN_SIZES", "").split(",") if s.strip())
        if any(s not in SIZES for s in sizes):
            log.error("IMAGE_GEN_SIZES lists a size image-gen/v1 does not offer (%s); all three are tried",
                      ", ".join(SIZES))
            sizes = ()
        fmt = env.get("IMAGE_GEN_RESPONSE_FORMAT", "").strip().lower() or "b64_json"
        if fmt not in ("b64_json", "none"):
            log.error("IMAGE_GEN_RESPONSE_FORMAT must be b64_json or none; b64_json is sent")
            fmt = "b64_json"
        return cls(model=env.get("IMAGE_GEN_MODEL", "").strip(), api_key=env.get("IMAGE_GEN_API_KEY", "").strip()
                   or None, base_url=(env.get("IMAGE_GEN_BASE_URL", "").strip() or DEFAULT_BASE_URL).rstrip("/"),
                   sizes=sizes or SIZES, response_format=fmt == "b64_json")


def retry_after(headers: httpx.Headers) -> str:
    """'retry after N seconds' from a Retry-After in seconds, else a plain 'wait' (a date or junk is not repeated)."""
    value = headers.get("retry-after", "").strip()
    if value.isdigit() and int(value) <= _RETRY_AFTER_MAX:
        return f"retry after {int(value)} seconds"
    return "wait a minute before generating again"


def error_code(body: bytes) -> str:
    """The OpenAI-style `error.code` (or `error.type`) of an error answer, '' when there is none; only this
    identifier is used, never the service's message."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return ""
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and value in (*_REFUSED_CODES, "insufficient_quota"):
            return value
    return str(error.get("code") or "")[:80]


def refusal(status: int, headers: httpx.Headers, code: str) -> InterfaceError:
    """The interface error for an answer that is not 200, from its status, headers and error code only."""
    if status == 400 and code in _REFUSED_CODES:
        return InterfaceError("refused", "the provider's content policy declined this prompt; do not retry it as "
                              "is")
    if status in (401, 403):
        return needs_a_person(f"the image service refused the API key (HTTP {status}); the binding's key is wrong, "
                              "revoked or without access to image generation, and an administrator must replace it")
    if code == "insufficient_quota":
        return needs_a_person("the image service's quota or credit for this key is used up; generating will work "
                              "again once an administrator tops the account up")
    if status == 429:
        return InterfaceError("limit", f"the image service's rate limit was reached; {retry_after(headers)}")
    if status >= 500:
        return InterfaceError("unavailable", f"the image service is failing (HTTP {status}); retrying later may "
                              "work")
    log.warning("the image service answered HTTP %s (error code %r)", status, code)
    return InterfaceError("unavailable", f"the image service did not accept the request (HTTP {status}), and it "
                          "will not accept it again: the binding's model may not make this size, so ask for another "
                          "size, or tell the user", retry="never")


async def read_bounded(response: httpx.Response, limit: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise InterfaceError("unavailable", "the image service's answer was larger than one image")
    return bytes(body)


def request_body(prompt: str, size: str, settings: Settings) -> dict[str, Any]:
    body: dict[str, Any] = {"model": settings.model, "prompt": prompt, "n": 1, "size": size}
    if settings.response_format:
        body["response_format"] = "b64_json"
    return body


async def post(body: dict[str, Any], settings: Settings) -> bytes:
    """POST the request; the answer's bytes (bounded), or an InterfaceError."""
    headers = {"accept": "application/json"}
    if settings.api_key:
        headers["authorization"] = f"Bearer {settings.api_key}"
    try:
        async with (httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False) as client,
                    client.stream("POST", settings.base_url + GENERATIONS_PATH, json=body,
                                  headers=headers) as response):
            if response.status_code != 200:
                raw = await read_bounded(response, MAX_ERROR_BODY)
                raise refusal(response.status_code, response.headers, error_code(raw))
            return await read_bounded(response, MAX_BODY)
    except httpx.TimeoutException:
        raise InterfaceError("unavailable", "the image service did not answer in time; retrying later may "
                             "work") from None
    except httpx.HTTPError as exc:
        log.warning("request to the image service failed: %s", type(exc).__name__)
        raise InterfaceError("unavailable", "the image service could not be reached; retrying later may "
                             "work") from None


def image_from_answer(raw: bytes) -> tuple[bytes, int, int]:
    """The PNG of the answer's first image and its width and height; anything else is `unavailable`."""
    malformed = InterfaceError("unavailable", "the image service sent an answer this connector cannot read; "
                               "retrying later may work")
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        raise malformed from None
    data = answer.get("data") if isinstance(answer, dict) else None
    item = data[0] if isinstance(data, list) and data else None
    encoded = item.get("b64_json") if isinstance(item, dict) else None
    if not isinstance(encoded, str):
        raise malformed
    try:
        image = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise malformed from None
    if not image.startswith(_PNG) or len(image) < 33 or image[12:16] != b"IHDR":
        kind = next((name for magic, name in _OTHER_IMAGES if image.startswith(magic)), "")
        if kind:
            raise needs_a_person(f"the image service sent a {kind} image, and this interface writes PNG only; an "
                                 "administrator must set the binding's model to answer PNG")
        raise malformed
    width, height = struct.unpack(">II", image[16:24])
    if not width or not height:
        raise malformed
    return image, width, height


async def generate(prompt: str, output: Path, size: str, settings: Settings) -> dict[str, Any]:
    """image_gen_generate's output, the PNG written at `output`; or an InterfaceError."""
    problem = check_base_url(settings.base_url)
    if problem or not settings.model:
        raise needs_a_person("this binding is not usable: " + (problem or "IMAGE_GEN_MODEL is not set; the binding "
                             "must name the model, e.g. dall-e-2"))
    if size not in settings.sizes:
        raise InterfaceError("unavailable", f"this binding's model does not make {size} images; ask for "
                             f"{' or '.join(settings.sizes)}", retry="never")
    raw = await post(request_body(prompt, size, settings), settings)
    image, width, height = image_from_answer(raw)
    try:
        output.write_bytes(image)
    except OSError as exc:
        raise InterfaceError("unavailable", f"the image could not be saved: {exc.strerror}") from None
    return {"path": str(output), "width": width, "height": height}


def image_gen_generate(settings: Settings) -> Handler:
    async def handle(args: dict[str, Any]) -> Reply:
        prompt, size = args["prompt"], args.get("size", DEFAULT_SIZE)
        if not prompt.strip():
            raise InterfaceError("invalid_arguments", "prompt is only spaces; describe the image to make")
        result = await generate(prompt, Path(args["outputPath"]), size, settings)
        return Reply(result, f"{result['width']}x{result['height']} PNG written to {result['path']}")

    return handle


def main() -> None:
    settings = Settings.from_env(os.environ)
    problem = check_base_url(settings.base_url) or ("" if settings.model else "IMAGE_GEN_MODEL is not set")
    serve("image-gen/v1", "image-gen-openai", {"image_gen_generate": image_gen_generate(settings)}, problem=problem,
          failed="the image generation failed unexpectedly; retrying later may work")


if __name__ == "__main__":
    main()
