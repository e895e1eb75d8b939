"""`handler call --url` end to end: `handler up`'s own listener, the profile's MCP endpoint over Streamable HTTP and
its files endpoint; the caller's local file is uploaded and read by the connector, an output comes back to the
caller's folder, and the copies leave the work folder again."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.app import UpOptions
from reconciler.cli import main
from reconciler.governance.store import open_store
from reconciler.governance.tokens import create_token
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import short_dir
from tests.fixtures.service import running

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "token-A")
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_PUBLIC_URL", "HANDLER_DASHBOARD_TOKEN",
                 "HANDLER_TOKEN", "HANDLER_INSTANCE", "HANDLER_PARENT_INSTANCE"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as path:
        yield path


def _tokens(state: Path, profiles: tuple[str, ...]) -> dict[str, str]:
    """A token of each profile, made in the running service's store as `handler token create` makes them."""
    store = open_store(f"sqlite:///{state / 'handler.db'}")
    try:
        return {p: create_token(store, p, name=p, instance=None, expires_in=60, actor="test").token for p in profiles}
    finally:
        store.close()


def test_handler_call_url_uploads_calls_downloads_and_clears(short: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_echo_tree(short / "tree", profiles=("tester", "other"))
    caller = short / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    (caller / "page.png").write_bytes(b"\x89PNG" + bytes(range(256)) * 3)
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0, sandbox=False)

    async def scenario() -> list[tuple[int, str, str]]:
        async with running(options) as service:
            assert service.listener is not None
            url = f"http://127.0.0.1:{service.listener.port}"
            tokens = _tokens(short / "state", ("tester", "other"))
            runs = []
            for argv in (["echo_read", "--path", "page.png", "--format", "json"],
                         ["echo_write", "--text", "spoken", "--output-path", "speech.txt"]):
                code = await asyncio.to_thread(main, ["call", "echo", *argv, "--profile", "tester", "--url", url,
                                                      "--token", tokens["tester"]])
                runs.append((code, *capsys.readouterr()))
            code = await asyncio.to_thread(main, ["call", "echo", "echo_say", "--text", "x", "--profile", "tester",
                                                  "--url", url, "--token", tokens["other"]])
            runs.append((code, *capsys.readouterr()))
            return runs

    (read_code, read_out, _), (write_code, _, write_err), (other_code, other_out, other_err) = asyncio.run(
        asyncio.wait_for(scenario(), 90))
    assert read_code == 0
    body = json.loads(read_out)
    assert (body["bytes"], body["sha256"]) == (772, hashlib.sha256((caller / "page.png").read_bytes()).hexdigest())
    assert write_code == 0
    assert (caller / "speech.txt").read_text() == "spoken"
    assert "handler call: wrote speech.txt" in write_err
    assert sorted(p.name for p in (root / "work/tester").iterdir()) == [".handler-call"]
    assert list((root / "work/tester/.handler-call").iterdir()) == []
    assert (other_code, other_out) == (1, "")
    assert "the router answered 401" in other_err


def test_handler_call_url_reads_a_local_scan_and_brings_speech_back(short: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped tree's OCR (Tesseract) and speech (Festival), called from another folder as a remote caller would:
    the PNG is the caller's, the WAV lands in the caller's folder."""
    root = short / "tree"
    for part in ("catalog/interfaces", "catalog/connectors", "config"):
        shutil.copytree(REPO / part, root / part)
    for profile in ("researcher", "assistant"):
        (root / "work" / profile).mkdir(parents=True)
    caller = short / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    shutil.copy(REPO / "catalog/interfaces/ocr/v1/conformance/invoice.png", caller / "scan.png")
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0, sandbox=False)

    async def scenario() -> list[tuple[int, str, str]]:
        async with running(options) as service:
            assert service.listener is not None
            url = f"http://127.0.0.1:{service.listener.port}"
            tokens = _tokens(short / "state", ("researcher", "assistant"))
            runs = []
            for interface, argv, profile in (
                    ("ocr", ["ocr_extract", "--path", "scan.png"], "researcher"),
                    ("tts", ["tts_synthesize", "--text", "The report is due on Friday.", "--output-path",
                             "brief.wav"], "assistant")):
                code = await asyncio.to_thread(main, ["call", interface, *argv, "--profile", profile, "--url", url,
                                                      "--token", tokens[profile]])
                runs.append((code, *capsys.readouterr()))
            return runs

    (ocr_code, ocr_out, ocr_err), (tts_code, _, tts_err) = asyncio.run(asyncio.wait_for(scenario(), 300))
    assert ocr_code == 0, ocr_err
    assert ocr_out.count("INV-2024-0042") == 1, ocr_out  # read from the caller's own file, printed once
    assert tts_code == 0, tts_err
    wav = (caller / "brief.wav").read_bytes()
    assert wav[:4] == b"RIFF"
    assert wav[8:12] == b"WAVE"
    assert len(wav) > 20_000  # a second or two of speech, not an empty file
    assert not list((root / "work/researcher").rglob("*.png"))  # the upload left the work folder again
