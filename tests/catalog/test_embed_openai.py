"""The OpenAI-compatible embedding connector against a loopback stand-in for `POST /v1/embeddings`: vectors in
input order, batches, every failure mapped onto embed/v1's closed list, and the same through the real,
sandboxed router and `handler connector check`.

The stand-in checks what OpenAI's embeddings API checks (POST on the path, a Bearer key, a JSON body with a
model and an `input` list of non-empty strings, `dimensions` a whole number when given) and answers 400 to
any other request, 401 to a wrong key; like text-embeddings-inference, it answers 413 to a batch over 32
texts. Its vectors are hashed bags of words, so texts sharing words are near (a few words of the semantic
cases count as one concept, `CONCEPTS`, so those cases hold as they would against a real model: a check
against this stand-in proves the wire, never the model's quality); the first text of a few reserved
inputs plays back failures.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.util
import json
import math
import re
import struct
import sys
import time
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
CONNECTOR = REPO / "catalog/connectors/embed-openai/main.py"
TOOL = json.loads((REPO / "catalog/interfaces/embed/v1/tools.json").read_text())[0]
KEY = "sk-test-embeddings"
MODEL = "text-embedding-3-small"
DIMENSIONS, MAX_BATCH = 16, 32


# Words the stand-in takes for one concept: those of embed/v1's semantic cases.
CONCEPTS = {"kitten": "cat", "bill": "invoice", "settle": "pay", "paid": "pay", "weekend": "friday"}


def bag_of_words(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """A unit vector: each word (or its concept) hashed onto one dimension."""
    vector = [0.0] * dimensions
    for found in re.findall(r"\w+", text.lower()) or [text]:
        word = CONCEPTS.get(found, found)
        vector[hashlib.sha256(word.encode()).digest()[0] % dimensions] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [round(x / norm, 6) for x in vector]


def shape_problem(handler: QuietHandler, body: Any) -> str | None:
    """What is wrong with a request, as OpenAI's embeddings API documents it; None when it is well formed."""
    if handler.path != "/v1/embeddings" or handler.headers.get("content-type") != "application/json":
        return "path"
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
        return "model"
    texts = body.get("input")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        return "input"
    if "dimensions" in body and (isinstance(body["dimensions"], bool) or not isinstance(body["dimensions"], int)):
        return "dimensions"
    if body.get("encoding_format", "float") not in ("float", "base64") or set(body) - {
            "model", "input", "dimensions", "encoding_format", "user"}:
        return "fields"
    return None


def error_body(message: str, code: str | None = None, kind: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


class Embeddings(QuietHandler):
    """The stand-in: 401 to a wrong key, 400 to any request not shaped like OpenAI's; else by the first text."""

    seen: ClassVar[list[dict[str, Any]]] = []
    refused: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.refused.append("method")
        self.send_body(400, error_body("GET is not allowed"), "application/json")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.headers.get("authorization") != f"Bearer {KEY}":
            self.refused.append("auth")
            self.send_body(401, error_body("<secret vendor wording> Incorrect API key", "invalid_api_key"),
                           "application/json")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        problem = shape_problem(self, body)
        if problem:
            self.refused.append(problem)
            self.send_body(400, error_body("<secret vendor wording>"), "application/json")
            return
        self.seen.append(body)
        self.answer(body["input"], body.get("dimensions", DIMENSIONS))

    def reply(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for name, value in {"content-type": "application/json", **headers}.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, texts: list[str], dimensions: int) -> None:
        if len(texts) > MAX_BATCH:  # text-embeddings-inference's answer to a batch over its limit
            self.reply(413, json.dumps({"error": f"batch size {len(texts)} > maximum allowed batch size "
                                        f"{MAX_BATCH}", "error_type": "Validation"}).encode())
            return
        canned = {
            "too long": (400, error_body("This model's maximum context length is 8192 tokens, however you "
                                         "requested 9000 tokens <secret vendor wording>"), {}),
            "busy": (429, error_body("<secret vendor wording>", "rate_limit_exceeded", "requests"),
                     {"retry_after": "5"}),
            "broke": (429, error_body("<secret vendor wording>", "insufficient_quota", "insufficient_quota"), {}),
            "500": (500, b"Traceback (most recent call last): <secret vendor wording>", {}),
            "503": (503, error_body("<secret vendor wording>", None, "server_error"), {}),
            "garbled": (200, b"<html>gateway</html>", {}),
            "huge": (200, b'{"data": [' + b" " * 300_000 + b"]}", {}),
        }
        if texts[0] in canned:
            status, raw, headers = canned[texts[0]]
            self.reply(status, raw, **headers)
            return
        if texts[0] == "slow":
            time.sleep(1.0)
        data: list[dict[str, Any]] = [{"object": "embedding", "index": i, "embedding": bag_of_words(t, dimensions)}
                                      for i, t in enumerate(texts)]
        self.spoil(texts[0], data)
        self.reply(200, json.dumps({"object": "list", "data": data, "model": MODEL,
                                    "usage": {"prompt_tokens": 5, "total_tokens": 5}}).encode())

    @staticmethod
    def spoil(first: str, data: list[dict[str, Any]]) -> None:
        """Answers of the right status and the wrong shape, or reordered, as the first text asks."""
        if first == "shuffled":
            data.reverse()
        elif first == "base64":
            for item in data:
                item["embedding"] = base64.b64encode(struct.pack(f"<{DIMENSIONS}f", *item["embedding"])).decode()
        elif first == "short":
            data.pop()
        elif first == "ragged":
            data[-1]["embedding"] = data[-1]["embedding"][:3]
        elif first == "twice":
            data[-1]["index"] = 0
        elif first == "words":
            data[0]["embedding"] = ["a", "b"]


def load_connector() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embed_openai_main", CONNECTOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def embeddings(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, str]]:
    """The connector module and the stand-in's base URL (no request seen yet)."""
    monkeypatch.setattr(Embeddings, "seen", [])
    monkeypatch.setattr(Embeddings, "refused", [])
    with serving_http(Embeddings) as url:
        yield load_connector(), url


def embed(subject: tuple[ModuleType, str], texts: list[str], **given: Any) -> dict[str, Any]:
    module, url = subject
    settings = module.Settings(**{"model": MODEL, "api_key": KEY, "base_url": url, **given})
    output: dict[str, Any] = asyncio.run(asyncio.wait_for(module.embed(texts, settings), 30))
    return output


def failure(subject: tuple[ModuleType, str], texts: list[str], **given: Any) -> tuple[str, str]:
    error = raised(subject, texts, **given)
    return error.code, error.message


def raised(subject: tuple[ModuleType, str], texts: list[str], **given: Any) -> Any:
    """The interface error an embedding raises: its code, message and `retry`."""
    with pytest.raises(subject[0].InterfaceError) as caught:
        embed(subject, texts, **given)
    return caught.value


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_one_vector_per_text_in_order_and_valid(embeddings: tuple[ModuleType, str]) -> None:
    texts = ["the cat sleeps", "a cat sleeps here", "quarterly invoice totals"]
    output = embed(embeddings, texts)
    jsonschema.validate(output, TOOL["outputSchema"])
    assert output == {"vectors": [bag_of_words(t) for t in texts], "dimensions": DIMENSIONS}
    assert cosine(output["vectors"][0], output["vectors"][1]) > cosine(output["vectors"][0], output["vectors"][2])
    assert Embeddings.seen == [{"model": MODEL, "input": texts}]


def test_answers_out_of_order_or_in_base64_are_read_and_dimensions_sent(embeddings: tuple[ModuleType, str]) -> None:
    texts = ["shuffled", "second", "third"]
    assert embed(embeddings, texts)["vectors"] == [bag_of_words(t) for t in texts]
    decoded = embed(embeddings, ["base64", "second"])["vectors"]
    assert all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(decoded[1], bag_of_words("second"), strict=True))
    assert embed(embeddings, ["short vectors"], dimensions=8)["dimensions"] == 8
    assert Embeddings.seen[-1]["dimensions"] == 8


def test_more_texts_than_a_batch_go_in_several_requests(embeddings: tuple[ModuleType, str]) -> None:
    texts = [f"text number {i}" for i in range(64)]
    output = embed(embeddings, texts, batch=24)
    assert output["vectors"] == [bag_of_words(t) for t in texts]
    assert [len(request["input"]) for request in Embeddings.seen] == [24, 24, 16]


@pytest.mark.parametrize(("first", "code", "says", "retry"), [
    ("busy", "limit", "rate limit was reached; retry after 5 seconds", None),
    ("too long", "limit", "longer than the model accepts", None),
    ("broke", "unavailable", "quota or credit for this key is used up", "never"),  # until the account is topped up
    ("500", "unavailable", "failing (HTTP 500)", None),
    ("503", "unavailable", "failing (HTTP 503)", None),
    ("garbled", "unavailable", "cannot read", None),
    ("short", "unavailable", "cannot read", None),
    ("twice", "unavailable", "cannot read", None),
    ("words", "unavailable", "cannot read", None),
    ("ragged", "unavailable", "vectors of different lengths", None),
])
def test_each_failure_maps_onto_the_closed_list(embeddings: tuple[ModuleType, str], first: str, code: str,
                                                says: str, retry: str | None) -> None:
    error = raised(embeddings, [first, "another text"])
    got, message = error.code, error.message
    assert (got, says in message, error.retry) == (code, True, retry), message
    assert "secret" not in message
    assert "Traceback" not in message


def test_a_batch_over_the_server_limit_is_limit(embeddings: tuple[ModuleType, str]) -> None:
    """A TEI server refuses a batch over its limit with 413: the binding's batch setting is too large."""
    code, message = failure(embeddings, [f"text {i}" for i in range(40)], batch=64)
    assert (code, "send smaller batches" in message) == ("limit", True)
    assert "maximum allowed" not in message


def test_a_refused_key_is_unavailable(embeddings: tuple[ModuleType, str]) -> None:
    error = raised(embeddings, ["hello"], api_key="sk-wrong")
    code, message = error.code, error.message
    assert (code, "refused the API key (HTTP 401)" in message, error.retry) == ("unavailable", True, "never")
    assert "Incorrect" not in message
    assert failure(embeddings, ["hello"], api_key=None)[0] == "unavailable"
    assert Embeddings.refused == ["auth", "auth"]


def test_a_timeout_an_oversized_body_and_no_server_are_unavailable(embeddings: tuple[ModuleType, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = embeddings
    monkeypatch.setattr(module, "TIMEOUT", httpx.Timeout(0.3))
    code, message = failure(embeddings, ["slow"])
    assert (code, "did not answer in time" in message) == ("unavailable", True)
    monkeypatch.setattr(module, "MAX_BODY", 100_000)
    code, message = failure(embeddings, ["huge"])
    assert (code, "far larger" in message) == ("unavailable", True)
    code, message = failure((module, "http://127.0.0.1:9"), ["hello"])
    assert (code, "could not be reached" in message) == ("unavailable", True)


def test_a_request_of_the_wrong_shape_is_refused_by_the_stand_in(embeddings: tuple[ModuleType, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = embeddings
    right = module.request_body
    monkeypatch.setattr(module, "request_body", lambda texts, given: {"model": given.model, "texts": texts})
    refused = raised(embeddings, ["hello"])
    assert (refused.code, refused.retry) == ("unavailable", "never")
    assert refused.message.startswith("the embedding service did not accept the request (HTTP 400); the binding's "
                                      "model may be wrong")
    monkeypatch.setattr(module, "request_body", right)
    monkeypatch.setattr(module, "EMBEDDINGS_PATH", "/v1/embedding")
    assert failure(embeddings, ["hello"])[0] == "unavailable"
    assert Embeddings.refused == ["input", "path"]
    assert Embeddings.seen == []


def test_no_model_or_a_bad_address_is_unavailable_without_a_request(embeddings: tuple[ModuleType, str]) -> None:
    assert "EMBED_MODEL is not set" in failure(embeddings, ["hello"], model="")[1]
    message = failure((embeddings[0], "ftp://10.0.0.7:11434"), ["hello"])[1]
    assert "must be an http:// or https:// address" in message
    assert Embeddings.seen == Embeddings.refused == []


BINDING = """apiVersion = "handler.binding/v1"
name = "embed-test"
connector = "embed-openai"
secrets = {{ api_key = {{ env = "TEST_EMBED_KEY" }} }}
settings = {{ base_url = "{url}", model = "{model}", batch = 32 }}
egress = ["{egress}"]  # the stand-in's exact address: the only loopback address the sandbox's proxy allows

[pricing]
embed_texts = 0.001
"""


@pytest.fixture
def embed_tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config tree whose binding `embed-test` points at a running stand-in; the tester profile uses it."""
    monkeypatch.setenv("TEST_EMBED_KEY", KEY)
    monkeypatch.setattr(Embeddings, "seen", [])
    with serving_http(Embeddings) as url, short_dir() as folder:
        text = BINDING.format(url=url, model=MODEL, egress=egress_of(url))
        yield write_tree(folder / "t", "embed-test", text, "embed")


def test_through_the_sandboxed_router(embed_tree: Path) -> None:
    texts = [f"text number {i}" for i in range(64)]

    found, busy = calls_through_router(embed_tree, "embed_texts", {"texts": texts}, {"texts": ["busy"]})  # sandboxed
    assert not found.get("isError"), found
    assert found["structuredContent"] == {"vectors": [bag_of_words(t) for t in texts], "dimensions": DIMENSIONS}
    assert [len(request["input"]) for request in Embeddings.seen] == [32, 32, 1]  # the binding's batch of 32
    assert busy["isError"] is True
    assert body(busy)["error"] == "limit"


def test_connector_check_passes_against_the_stand_in(embed_tree: Path, tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    summary = passing_check("embed-openai", "embed-test", embed_tree, "embed/v1",
                            **stand_in_replay(seed=3, examples=10), result=tmp_path / "result.json", capfd=capfd,
                            record=stand_in_record())
    assert summary["cases"]["passed"] == 4
    assert summary["fuzzing_pass"]
