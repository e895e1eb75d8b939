"""The OpenAI-compatible image connector against a loopback stand-in for `POST /v1/images/generations`: the
PNG written and measured, every failure mapped onto image-gen/v1's closed list, and the same through the
real, sandboxed router and `handler connector check`.

The stand-in checks what OpenAI's images API checks (POST on the path, a Bearer key, a JSON body with a
model, a prompt, n = 1, a known size and response_format b64_json) and answers 400 to any other request,
401 to a wrong key. It draws a real PNG of the size asked; a few reserved prompts play back failures.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import httpx
import jsonschema
import pytest

from tests.fixtures.harness import body, short_dir
from tests.fixtures.loopback import QuietHandler, serving_http
from tests.fixtures.vendor_trees import (
    calls_through_router,
    egress_of,
    passing_check,
    stand_in_record,
    stand_in_replay,
    write_tree,
)

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/image-gen-openai/main.py"
TOOL = json.loads((REPO / "catalog/interfaces/image-gen/v1/tools.json").read_text())[0]
KEY = "sk-test-images"
MODEL = "dall-e-2"


def png(width: int, height: int) -> bytes:
    """A real PNG: one colour, 8-bit RGB."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xc0\x20\x20" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def openai_error(code: str | None, kind: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": f"<secret vendor wording> {code}", "type": kind, "param": None,
                                 "code": code}}).encode()


def shape_problem(handler: QuietHandler, body: Any) -> str | None:
    """What is wrong with a request, as OpenAI's images API documents it; None when it is well formed."""
    if handler.path != "/v1/images/generations" or handler.headers.get("content-type") != "application/json":
        return "path"
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
        return "model"
    if not isinstance(body.get("prompt"), str) or not body["prompt"] or body.get("n", 1) != 1:
        return "prompt"
    if body.get("size", "1024x1024") not in ("256x256", "512x512", "1024x1024"):
        return "size"
    if body.get("response_format", "b64_json") != "b64_json":
        return "response_format"
    return None


class Images(QuietHandler):
    """The stand-in: 401 to a wrong key, 400 to any request not shaped like OpenAI's; else what the prompt says."""

    seen: ClassVar[list[dict[str, Any]]] = []
    refused: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.refused.append("method")
        self.send_body(400, openai_error(None), "application/json")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.headers.get("authorization") != f"Bearer {KEY}":
            self.refused.append("auth")
            self.send_body(401, openai_error("invalid_api_key"), "application/json")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        problem = shape_problem(self, body)
        if problem:
            self.refused.append(problem)
            self.send_body(400, openai_error(None), "application/json")
            return
        self.seen.append(body)
        self.answer(body["prompt"], body.get("size", "1024x1024"))

    def reply(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for name, value in {"content-type": "application/json", **headers}.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, prompt: str, size: str) -> None:
        canned = {
            "refused": (400, openai_error("content_policy_violation", "image_generation_user_error"), {}),
            "moderated": (400, openai_error("moderation_blocked"), {}),
            "busy": (429, openai_error("rate_limit_exceeded", "requests"), {"retry_after": "20"}),
            "broke": (429, openai_error("insufficient_quota", "insufficient_quota"), {}),
            "500": (500, b"Traceback (most recent call last): <secret vendor wording>", {}),
            "503": (503, openai_error(None, "server_error"), {}),
            "garbled": (200, b"<html>gateway</html>", {}),
            "empty": (200, b'{"created": 1, "data": []}', {}),
            "not base64": (200, b'{"created": 1, "data": [{"b64_json": "%%% not base64 %%%"}]}', {}),
            "jpeg": (200, json.dumps({"data": [{"b64_json": base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 64)
                                               .decode()}]}).encode(), {}),
            "huge": (200, b'{"data": [{"b64_json": "' + b"A" * 300_000 + b'"}]}', {}),
        }
        if prompt in canned:
            status, body, headers = canned[prompt]
            self.reply(status, body, **headers)
            return
        if prompt == "slow":
            time.sleep(1.0)
        width, height = (int(n) for n in size.split("x"))
        image = base64.b64encode(png(width, height)).decode()
        self.reply(200, json.dumps({"created": 1_700_000_000, "data": [{"b64_json": image}]}).encode())


def load_connector() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_gen_openai_main", CONNECTOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def images(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, str]]:
    """The connector module and the stand-in's base URL (no request seen yet)."""
    monkeypatch.setattr(Images, "seen", [])
    monkeypatch.setattr(Images, "refused", [])
    with serving_http(Images) as url:
        yield load_connector(), url


def generate(subject: tuple[ModuleType, str], prompt: str, output: Path, size: str = "1024x1024",
             **given: Any) -> dict[str, Any]:
    module, url = subject
    settings = module.Settings(**{"model": MODEL, "api_key": KEY, "base_url": url, **given})
    result: dict[str, Any] = asyncio.run(asyncio.wait_for(module.generate(prompt, output, size, settings), 30))
    return result


def failure(subject: tuple[ModuleType, str], prompt: str, output: Path, **given: Any) -> tuple[str, str]:
    error = raised(subject, prompt, output, **given)
    return error.code, error.message


def raised(subject: tuple[ModuleType, str], prompt: str, output: Path, **given: Any) -> Any:
    """The interface error a generation raises: its code, message and `retry`."""
    with pytest.raises(subject[0].InterfaceError) as caught:
        generate(subject, prompt, output, **given)
    return caught.value


def test_the_png_is_written_and_measured(images: tuple[ModuleType, str], tmp_path: Path) -> None:
    output = tmp_path / "apple.png"
    result = generate(images, "A red apple on a white table", output, "256x256")
    jsonschema.validate(result, TOOL["outputSchema"])
    assert result == {"path": str(output), "width": 256, "height": 256}
    assert output.read_bytes() == png(256, 256)
    assert Images.seen == [{"model": MODEL, "prompt": "A red apple on a white table", "n": 1, "size": "256x256",
                            "response_format": "b64_json"}]


def test_response_format_can_be_left_out_and_sizes_narrowed(images: tuple[ModuleType, str], tmp_path: Path) -> None:
    result = generate(images, "a lighthouse", tmp_path / "l.png", response_format=False, sizes=("1024x1024",))
    assert (result["width"], result["height"]) == (1024, 1024)
    assert "response_format" not in Images.seen[0]
    with pytest.raises(images[0].InterfaceError) as caught:
        generate(images, "a lighthouse", tmp_path / "s.png", "256x256", sizes=("1024x1024",))
    assert (caught.value.code, caught.value.message, caught.value.retry) == (
        "unavailable", "this binding's model does not make 256x256 images; ask for 1024x1024", "never")
    assert len(Images.seen) == 1  # nothing was sent for a size the binding does not offer


@pytest.mark.parametrize(("prompt", "code", "says", "retry"), [
    ("refused", "refused", "content policy declined this prompt", None),  # the code says never
    ("moderated", "refused", "content policy declined this prompt", None),
    ("busy", "limit", "rate limit was reached; retry after 20 seconds", None),
    ("broke", "unavailable", "quota or credit for this key is used up", "never"),  # until the account is topped up
    ("500", "unavailable", "failing (HTTP 500)", None),
    ("503", "unavailable", "failing (HTTP 503)", None),
    ("garbled", "unavailable", "cannot read", None),
    ("empty", "unavailable", "cannot read", None),
    ("not base64", "unavailable", "cannot read", None),
    ("jpeg", "unavailable", "sent a JPEG image", "never"),  # until the binding is set to answer PNG
])
def test_each_failure_maps_onto_the_closed_list(images: tuple[ModuleType, str], tmp_path: Path, prompt: str,
                                                code: str, says: str, retry: str | None) -> None:
    error = raised(images, prompt, tmp_path / "x.png")
    got, message = error.code, error.message
    assert (got, says in message, error.retry) == (code, True, retry), message
    assert "secret" not in message
    assert "Traceback" not in message
    assert not (tmp_path / "x.png").exists()


def test_a_refused_key_is_unavailable(images: tuple[ModuleType, str], tmp_path: Path) -> None:
    error = raised(images, "an apple", tmp_path / "x.png", api_key="sk-wrong")
    assert (error.code, "refused the API key (HTTP 401)" in error.message, error.retry) == ("unavailable", True,
                                                                                           "never")
    assert failure(images, "an apple", tmp_path / "x.png", api_key=None)[0] == "unavailable"
    assert Images.refused == ["auth", "auth"]


def test_a_timeout_an_oversized_body_and_no_server_are_unavailable(images: tuple[ModuleType, str], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = images
    monkeypatch.setattr(module, "TIMEOUT", httpx.Timeout(0.3))
    code, message = failure(images, "slow", tmp_path / "x.png")
    assert (code, "did not answer in time" in message) == ("unavailable", True)
    monkeypatch.setattr(module, "MAX_BODY", 100_000)
    code, message = failure(images, "huge", tmp_path / "x.png")
    assert (code, "larger than one image" in message) == ("unavailable", True)
    code, message = failure((module, "http://127.0.0.1:9"), "an apple", tmp_path / "x.png")
    assert (code, "could not be reached" in message) == ("unavailable", True)


def test_a_request_of_the_wrong_shape_is_refused_by_the_stand_in(images: tuple[ModuleType, str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = images
    right = module.request_body
    monkeypatch.setattr(module, "request_body", lambda prompt, size, given: {**right(prompt, size, given), "n": 4})
    error = raised(images, "an apple", tmp_path / "x.png")
    assert (error.code, error.message.startswith("the image service did not accept the request (HTTP 400)"),
            error.retry) == ("unavailable", True, "never")
    monkeypatch.setattr(module, "request_body", right)
    monkeypatch.setattr(module, "GENERATIONS_PATH", "/v1/images/edits")
    assert failure(images, "an apple", tmp_path / "x.png")[0] == "unavailable"
    assert Images.refused == ["prompt", "path"]
    assert Images.seen == []


def test_no_model_or_a_bad_address_is_unavailable_without_a_request(images: tuple[ModuleType, str],
                                                                    tmp_path: Path) -> None:
    assert "IMAGE_GEN_MODEL is not set" in failure(images, "an apple", tmp_path / "x.png", model="")[1]
    module, _ = images
    message = failure((module, "https://user:pw@api.example.org"), "an apple", tmp_path / "x.png")[1]
    assert "must not hold a login" in message
    assert "pw" not in message
    assert Images.seen == Images.refused == []


BINDING = """apiVersion = "handler.binding/v1"
name = "images-test"
connector = "image-gen-openai"
secrets = {{ api_key = {{ env = "TEST_IMAGES_KEY" }} }}
settings = {{ base_url = "{url}", model = "{model}" }}
egress = ["{egress}"]  # the stand-in's exact address: the only loopback address the sandbox's proxy allows

[pricing]
image_gen_generate = 0.02
"""


@pytest.fixture
def images_tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config tree whose binding `images-test` points at a running stand-in; the tester profile uses it."""
    monkeypatch.setenv("TEST_IMAGES_KEY", KEY)
    monkeypatch.setattr(Images, "seen", [])
    with serving_http(Images) as url, short_dir() as folder:
        text = BINDING.format(url=url, model=MODEL, egress=egress_of(url))
        yield write_tree(folder / "t", "images-test", text, "image-gen")


def test_through_the_sandboxed_router_the_png_lands_in_the_work_folder(images_tree: Path) -> None:
    made, refused = calls_through_router(images_tree, "image_gen_generate",  # sandboxed
                                         {"prompt": "an apple", "outputPath": "out/a.png", "size": "512x512"},
                                         {"prompt": "refused", "outputPath": "out/b.png"})
    assert not made.get("isError"), made
    assert made["structuredContent"] == {"path": "out/a.png", "width": 512, "height": 512}
    assert (images_tree / "work/tester/out/a.png").read_bytes() == png(512, 512)
    assert refused["isError"] is True
    assert body(refused)["error"] == "refused"
    assert not (images_tree / "work/tester/out/b.png").exists()


def test_connector_check_passes_against_the_stand_in(images_tree: Path, tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    summary = passing_check("image-gen-openai", "images-test", images_tree, "image-gen/v1",
                            **stand_in_replay(seed=3, examples=5), result=tmp_path / "result.json", capfd=capfd,
                            record=stand_in_record())
    assert summary["cases"]["passed"] == 2
    assert summary["fuzzing_pass"]
