"""`handler-agent` as a profile's runner: a run started by a member calls the profile's llm/v2 binding (a loopback
stand-in speaking Anthropic's tool-calling format) which asks for OCR of a file of the scope; the loop runs that
call through the router (Tesseract, sandboxed) and the model's answer is the run's result."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.harness import run, serving, shipped_tree, short_dir
from tests.fixtures.vendors import Reply, anthropic_reply, let_llm_reach, serving_vendor

REPO = Path(__file__).resolve().parents[2]
AGENT = str(Path(sys.executable).parent / "handler-agent")


@pytest.fixture
def tree() -> Iterator[Path]:
    with shipped_tree() as root:
        yield root


def _researcher(root: Path, url: str) -> None:
    """researcher: ocr on Tesseract, llm on the stand-in, handler-agent as its runner."""
    entry = let_llm_reach(root, url)
    (root / "config/bindings/llm-anthropic.toml").write_text(
        'apiVersion = "handler.binding/v1"\nname = "llm-anthropic"\nconnector = "llm"\n'
        'secrets = { api_key = { env = "TEST_LLM_KEY" } }\n'
        f'settings = {{ endpoint = "anthropic", model = "m-1", base_url = "{url}" }}\negress = ["{entry}"]\n')
    (root / "config/profiles/researcher.toml").write_text(
        'apiVersion = "handler.profile/v1"\nname = "researcher"\ngroup = "research"\nscope = "work/researcher"\n'
        'template = "permissive"\nservices = { llm = "llm-anthropic", ocr = "ocr-local" }\n\n'
        f'[runner]\ncommand = {json.dumps([AGENT])}\ntimeoutSeconds = 120\n')
    (root / "work/researcher").mkdir(parents=True)
    shutil.copy(REPO / "catalog/interfaces/ocr/v1/conformance/invoice.pdf", root / "work/researcher/invoice.pdf")


def _model(path: str, body: Any) -> Reply:
    """Ask for OCR of the invoice first; once the tool's result is in the conversation, say what it read."""
    said = json.dumps(body["messages"][-1])
    if "tool_result" not in said:
        return anthropic_reply("", stop="tool_use", uses=[("toolu_1", "ocr_extract", {"path": "invoice.pdf"})])
    return anthropic_reply("The invoice is INV-2024-0042." if "INV-2024-0042" in said else "OCR read nothing.")


def test_a_member_started_handler_agent_run_reads_a_scan_through_ocr(tree: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "key-from-a-reference")
    with serving_vendor() as vendor, short_dir() as run_dir:
        vendor.script = _model
        _researcher(tree, vendor.url)

        async def scenario() -> None:
            async with serving(tree, run_dir) as router:
                started = router.runs.start("researcher", "What is the invoice number of invoice.pdf?",
                                            starter="member:alice")
                async with asyncio.timeout(100):
                    while started.status == "running":
                        await asyncio.sleep(0.1)
                assert started.status == "succeeded", started.error
                assert started.result == "The invoice is INV-2024-0042."

        run(scenario(), timeout=150)
    offered = [t["name"] for t in vendor.requests[0]["body"]["tools"]]
    assert "ocr_extract" in offered
    assert not any(name.startswith("llm_") for name in offered)
