"""ocr-mistral against a loopback stand-in for Mistral's OCR API: pages from the answer, every error class.

The connector's `main.py` is imported by path and its `extract` called directly, its BASE_URL pointed at
the stand-in; its tools/list is checked over stdio with the MCP SDK's own client.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import httpx
import jsonschema
import pytest

from tests.fixtures.harness import RawClient, body, run, serving, short_dir
from tests.fixtures.loopback import QuietHandler, serving_http

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/ocr-mistral"
FIXTURES = REPO / "catalog/interfaces/ocr/v1/conformance"
CONTRACT = json.loads((REPO / "catalog/interfaces/ocr/v1/tools.json").read_text())[0]
KEY = "test-key-123"
MODEL = "mistral-ocr-2505"
PAGES = [{"index": 1, "markdown": "Page two: Total 1,234.00 EUR"},
         {"index": 0, "markdown": "# Invoice INV-2024-0042\n\nACME SARL"}]


def load_main() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ocr_mistral_main", CONNECTOR / "main.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shape_problem(handler: QuietHandler, body: Any) -> str | None:
    """What is wrong with a request to the stand-in, as Mistral's documented API expects it."""
    if handler.path != "/v1/ocr":
        return "path"
    if handler.headers.get("authorization") != f"Bearer {KEY}":
        return "auth"
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
        return "model"
    document = body.get("document")
    kind = document.get("type") if isinstance(document, dict) else None
    prefix = {"document_url": "data:application/pdf;base64,", "image_url": "data:image/"}.get(str(kind))
    url = document.get(kind) if prefix and isinstance(document, dict) else None
    if not isinstance(url, str) or not url.startswith(prefix or "\0"):
        return "document"
    return None


class Mistral(QuietHandler):
    """The stand-in: 400 to any request not shaped like Mistral's; else what `mode` says."""

    mode: ClassVar[str] = "ok"
    seen: ClassVar[list[dict[str, Any]]] = []
    refused: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.refused.append("method")
        self.send_body(400, b'{"detail": "bad method"}', "application/json")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        problem = shape_problem(self, body)
        if problem:
            self.refused.append(problem)
            self.send_body(400, b'{"detail": "Invalid request <secret vendor wording>"}', "application/json")
            return
        self.seen.append(body)
        self.answer()

    def answer(self) -> None:
        mode = self.mode
        if mode == "ok":
            self.send_body(200, json.dumps({"pages": PAGES, "model": MODEL}).encode(), "application/json")
        elif mode.isdigit():
            body = b'{"message": "vendor trace xyz-internal"}'
            self.send_response(int(mode))
            self.send_header("retry-after", "30")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif mode == "slow":
            time.sleep(1.5)
            self.send_body(200, b'{"pages": []}', "application/json")
        elif mode == "malformed":
            self.send_body(200, b'{"pages": [{"index": 0}]}', "application/json")
        elif mode == "not-json":
            self.send_body(200, b"<html>gateway</html>", "text/html")
        elif mode == "huge":
            self.send_body(200, b'{"pages": [{"index": 0, "markdown": "' + b"a" * 300_000 + b'"}]}')


@pytest.fixture
def mistral(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """main.py, its BASE_URL on a fresh stand-in (mode 'ok', no request seen yet)."""
    module = load_main()
    monkeypatch.setattr(Mistral, "mode", "ok")
    monkeypatch.setattr(Mistral, "seen", [])
    monkeypatch.setattr(Mistral, "refused", [])
    with serving_http(Mistral) as url:
        monkeypatch.setattr(module, "BASE_URL", url)
        yield module


def extract(module: ModuleType, path: Path, key: str = KEY) -> dict[str, Any]:
    return asyncio.run(asyncio.wait_for(module.extract(path, key, MODEL), 30))


def error_of(module: ModuleType, path: Path, key: str = KEY) -> tuple[str, str]:
    error = raised(module, path, key)
    return error.code, error.message


def raised(module: ModuleType, path: Path, key: str = KEY) -> Any:
    """The interface error an extraction raises: its code, message and `retry`."""
    with pytest.raises(module.InterfaceError) as caught:
        extract(module, path, key)
    return caught.value


def test_a_pdf_becomes_the_answer_pages_in_order(mistral: ModuleType) -> None:
    output = extract(mistral, FIXTURES / "invoice.pdf")
    jsonschema.validate(output, CONTRACT["outputSchema"])
    assert output == {"pages": [{"text": "# Invoice INV-2024-0042\n\nACME SARL"},
                                {"text": "Page two: Total 1,234.00 EUR"}]}
    (sent,) = Mistral.seen
    assert sent["model"] == MODEL
    assert sent["document"]["type"] == "document_url"
    data = sent["document"]["document_url"].removeprefix("data:application/pdf;base64,")
    assert base64.b64decode(data) == (FIXTURES / "invoice.pdf").read_bytes()


def test_an_image_goes_as_an_image_url(mistral: ModuleType) -> None:
    assert extract(mistral, FIXTURES / "invoice.png")["pages"][0]["text"].startswith("# Invoice")
    (sent,) = Mistral.seen
    assert sent["document"]["type"] == "image_url"
    assert sent["document"]["image_url"].startswith("data:image/png;base64,")


def test_a_zip_is_unsupported_and_nothing_is_sent(mistral: ModuleType) -> None:
    code, message = error_of(mistral, FIXTURES / "archive.zip")
    assert code == "unsupported_format"
    assert "not a PDF or an image" in message
    assert Mistral.seen == []
    assert Mistral.refused == []


def test_a_file_over_the_interface_limit_is_too_large(mistral: ModuleType, tmp_path: Path) -> None:
    big = tmp_path / "big.pdf"
    with big.open("wb") as out:
        out.write(b"%PDF-1.7\n")
        out.truncate(mistral.MAX_FILE_BYTES + 1)
    assert error_of(mistral, big)[0] == "too_large"
    assert Mistral.seen == []


@pytest.mark.parametrize(("mode", "words", "retry"), [
    ("401", "refused the API key", "never"), ("403", "refused the API key", "never"),  # until a new key
    ("429", "retry in 30 seconds", None), ("500", "HTTP 500", None), ("503", "HTTP 503", None),
    ("malformed", "cannot read", None), ("not-json", "cannot read", None),
    ("huge", "split it into documents of fewer pages", "never"),  # the same document fails again
])
def test_each_vendor_failure_is_unavailable_in_plain_words(mistral: ModuleType, mode: str, words: str,
                                                           retry: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Mistral, "mode", mode)
    monkeypatch.setattr(mistral, "MAX_ANSWER_BYTES", 100_000)
    error = raised(mistral, FIXTURES / "invoice.pdf")
    code, message = error.code, error.message
    assert (code, words in message, error.retry) == ("unavailable", True, retry)
    assert "vendor" not in message
    assert "Traceback" not in message


def test_a_timeout_is_unavailable(mistral: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Mistral, "mode", "slow")
    monkeypatch.setattr(mistral, "TIMEOUT", httpx.Timeout(0.3))
    code, message = error_of(mistral, FIXTURES / "invoice.pdf")
    assert (code, "did not answer in time" in message) == ("unavailable", True)


def test_an_unreachable_service_or_missing_key_is_unavailable(mistral: ModuleType,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    missing = raised(mistral, FIXTURES / "invoice.pdf", key="")
    assert (missing.code, missing.retry) == ("unavailable", "never")
    assert "no Mistral API key is configured" in missing.message
    monkeypatch.setattr(mistral, "BASE_URL", "http://127.0.0.1:9")
    code, message = error_of(mistral, FIXTURES / "invoice.pdf")
    assert (code, "could not be reached" in message) == ("unavailable", True)
    assert Mistral.seen == []


def test_the_stand_in_refuses_a_wrong_shape(mistral: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in's checks bite: a body without the document's data URL is a 400, which is `unavailable`."""
    monkeypatch.setattr(mistral, "request_body", lambda data, mime, model: {"model": model,
                                                                            "document": {"type": "document_url"}})
    refused = raised(mistral, FIXTURES / "invoice.pdf")
    assert (refused.code, refused.retry) == ("unavailable", "never")
    assert refused.message.startswith("Mistral did not accept the request (HTTP 400); the operator must")
    assert Mistral.refused == ["document"]
    assert error_of(mistral, FIXTURES / "invoice.pdf", key="wrong")[0] == "unavailable"
    assert Mistral.refused == ["document", "auth"]


def test_through_the_router(shipped_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped binding (ocr-mistral-perso) behind the auditor's ocr/v1, the connector's base URL rewritten."""
    monkeypatch.setenv("MISTRAL_TEST_KEY", KEY)
    binding = shipped_tree / "config/bindings/ocr-mistral-perso.toml"
    binding.write_text(binding.read_text().replace('{ command = ["pass", "show", "mistral/ocr"] }',
                                                   '{ env = "MISTRAL_TEST_KEY" }'))
    profile = shipped_tree / "config/profiles/auditor.toml"
    profile.write_text(profile.read_text().replace('"ocr/v1" = "ocr-local"', '"ocr/v1" = "ocr-mistral-perso"'))
    scope = shipped_tree / "work/auditor"
    scope.mkdir(parents=True)
    for name in ("invoice.pdf", "archive.zip"):
        (scope / name).write_bytes((FIXTURES / name).read_bytes())
    main = shipped_tree / "catalog/connectors/ocr-mistral/main.py"
    monkeypatch.setattr(Mistral, "mode", "ok")
    monkeypatch.setattr(Mistral, "seen", [])
    with serving_http(Mistral) as url, short_dir() as run_dir:
        main.write_text(main.read_text().replace('BASE_URL = "https://api.mistral.ai"', f'BASE_URL = "{url}"'))

        async def scenario() -> list[dict[str, Any]]:
            # sandbox=False: the stand-in is on loopback, which the sandbox's network namespace cannot reach.
            async with serving(shipped_tree, run_dir, sandbox=False) as router:
                client = await RawClient.connect(router.socket_path("auditor"))
                try:
                    return [await client.call("ocr_extract", {"path": "invoice.pdf"}),
                            await client.call("ocr_extract", {"path": "archive.zip"})]
                finally:
                    await client.close()

        read, zipped = run(scenario())
    assert read.get("isError") is not True, read
    jsonschema.validate(read["structuredContent"], CONTRACT["outputSchema"])
    assert [page["text"] for page in read["structuredContent"]["pages"]] == [PAGES[1]["markdown"],
                                                                            PAGES[0]["markdown"]]
    assert zipped["isError"] is True
    assert body(zipped)["error"] == "unsupported_format"
    assert len(Mistral.seen) == 1  # the zip never left the machine
    assert Mistral.seen[0]["model"] == "mistral-ocr-latest"
