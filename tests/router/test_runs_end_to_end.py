"""Agent runs end to end (docs/agents.md): a member starts an orchestrator from the command line, whose model (a
loopback stand-in speaking OpenAI's tool-calling format) runs a researcher through `agent_run` and follows it with
`agent_status`; the researcher's model (Anthropic's format) has OCR read a scan of its scope. Both runs are
`handler-agent`, the service's own runner; `handler agent status` and `list` show the result and the tree of runs.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.app import UpOptions
from tests.fixtures.harness import run, short_dir
from tests.fixtures.service import running
from tests.fixtures.vendors import Reply, Vendor, anthropic_reply, openai_reply, serving_vendor

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ASKED = "What is the invoice number of invoice.pdf?"
INVOICE = "INV-2024-0042"  # what the OCR conformance scan reads


@pytest.fixture
def tree() -> Iterator[Path]:
    """The shipped catalog and config (its org: alice, an owner, and bob, a member) in a short folder."""
    with short_dir() as folder:
        root = folder / "t"
        for part in ("catalog/interfaces", "catalog/connectors", "config"):
            shutil.copytree(REPO / part, root / part)
        yield root


def _model_bindings(root: Path, url: str) -> None:
    """llm-openai and llm-anthropic both reach the stand-in (the built-in llm's egress lists it)."""
    entry = url.split("://", 1)[1].rstrip("/")
    manifest = root / "catalog/connectors/llm/connector.toml"
    reach = manifest.read_text().replace('"api.anthropic.com:443"]', f'"api.anthropic.com:443", "{entry}"]')
    manifest.write_text(reach)
    for name, endpoint in (("llm-openai", "openai-chat"), ("llm-anthropic", "anthropic")):
        (root / f"config/bindings/{name}.toml").write_text(
            f'apiVersion = "handler.binding/v1"\nname = "{name}"\nconnector = "llm"\n'
            'secrets = { api_key = { env = "TEST_LLM_KEY" } }\n'
            f'settings = {{ endpoint = "{endpoint}", model = "m-1", base_url = "{url}" }}\negress = ["{entry}"]\n')


def _agents(root: Path) -> None:
    """orchestrator (its model on OpenAI's format) may run researcher (Anthropic's, with OCR); both permissive, so
    nothing is held, and both run `handler-agent`."""
    runner = f'[runner]\ncommand = {json.dumps([str(BIN / "handler-agent")])}\ntimeoutSeconds = 120\n'
    profiles = root / "config/profiles"
    (profiles / "orchestrator.toml").write_text(
        'apiVersion = "handler.profile/v1"\nname = "orchestrator"\nscope = "work/orchestrator"\n'
        'template = "permissive"\nagents = ["researcher"]\n'
        'services = { agent = "agents", llm = "llm-openai" }\n\n' + runner)
    (profiles / "researcher.toml").write_text(
        'apiVersion = "handler.profile/v1"\nname = "researcher"\ngroup = "research"\nscope = "work/researcher"\n'
        'template = "permissive"\nservices = { llm = "llm-anthropic", ocr = "ocr-local" }\n\n' + runner)
    (root / "work/researcher").mkdir(parents=True)
    shutil.copy(REPO / "catalog/interfaces/ocr/v1/conformance/invoice.pdf", root / "work/researcher/invoice.pdf")


class Models:
    """The two scripted models behind one stand-in, told apart by the vendor's path."""

    def __init__(self) -> None:
        self.researcher_answered = threading.Event()
        self.polls = 0

    def __call__(self, path: str, body: Any) -> Reply:
        return self.researcher(body) if path.endswith("/messages") else self.orchestrator(body)

    def researcher(self, body: Any) -> Reply:
        """Ask for OCR of the invoice; once its result is in the conversation, say the number it read."""
        said = json.dumps(body["messages"][-1])
        if "tool_result" not in said:
            return anthropic_reply("", stop="tool_use", uses=[("toolu_1", "ocr_extract", {"path": "invoice.pdf"})])
        self.researcher_answered.set()
        found = re.search(r"INV-\d{4}-\d{4}", said)
        return anthropic_reply(f"The invoice number is {found.group(0)}." if found else "OCR read no number.")

    def orchestrator(self, body: Any) -> Reply:
        """Run the researcher, follow its run with agent_status until it ended, then answer with its result."""
        last = body["messages"][-1]
        if last["role"] != "tool":
            task = json.dumps({"agent": "researcher", "input": ASKED})
            return openai_reply(None, "tool_calls", calls=[("call_run", "agent_run", task)])
        seen = json.loads(last["content"])
        if seen.get("status") == "succeeded":
            return openai_reply(f"The researcher says: {seen['result']}")
        if seen.get("status") != "running":
            return openai_reply(f"The researcher's run did not succeed: {seen}")
        self.polls += 1
        if not self.researcher_answered.wait(60):
            return openai_reply("The researcher's model was never asked.")
        follow = json.dumps({"run": seen["run"]})
        asked = openai_reply(None, "tool_calls", calls=[(f"call_{self.polls}", "agent_status", follow)])
        asked.delay = 0.5 if self.polls > 1 else 0.0  # the run ends as its model answers: ask again in a while
        return asked


async def _cli(*args: str) -> tuple[int, str, str]:
    done = await asyncio.create_subprocess_exec(str(BIN / "handler"), "agent", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await done.communicate()
    return done.returncode or 0, out.decode(), err.decode()


async def _ended(run_id: str, where: tuple[str, ...]) -> str:
    """`handler agent status RUN` once the run is no longer running: what it printed (it exits 0 on success)."""
    async with asyncio.timeout(150):
        while True:
            code, out, err = await _cli("status", run_id, *where)
            assert out, err
            if f"{run_id}  orchestrator  running" not in out:
                assert code == 0, out
                return out
            await asyncio.sleep(0.2)


def _vendor_of(models: Models, vendor: Vendor, root: Path) -> None:
    vendor.script = models
    _model_bindings(root, vendor.url)
    _agents(root)


def test_a_member_runs_an_orchestrator_that_runs_a_researcher_reading_a_scan(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "key-from-a-reference")
    models = Models()
    with serving_vendor() as vendor, short_dir() as short:
        _vendor_of(models, vendor, tree)
        options = UpOptions(root=str(tree), run_dir=short / "run", state_dir=short / "state", http_port=0)
        where = ("--root", str(tree), "--state-dir", str(short / "state"))

        async def scenario() -> tuple[str, str]:
            async with running(options):
                code, out, err = await _cli("run", "orchestrator", "--input", "Find the invoice's number.", "--as",
                                            "bob", "--format", "json", *where)
                assert code == 0, err
                started = json.loads(out)
                assert (started["status"], started["starter"], started["parent"]) == ("running", "member:bob", None)
                status = await _ended(started["run"], where)
                code, listed, err = await _cli("list", *where)
                assert code == 0, err
                return f"{started['run']}\n{status}", listed

        shown, listed = run(scenario(), timeout=200)
    orchestrator, status = shown.split("\n", 1)
    assert f"{orchestrator}  orchestrator  succeeded  parent: -  starter: member:bob" in status, status
    assert f"result: The researcher says: The invoice number is {INVOICE}." in status
    rows = {line.split()[1]: line.split() for line in listed.splitlines()}
    assert set(rows) == {"orchestrator", "researcher"}, listed
    researcher = rows["researcher"]
    assert researcher[2] == "succeeded"
    assert researcher[3:] == ["parent:", orchestrator, "starter:", f"run:{orchestrator}"]
    assert rows["orchestrator"][3:] == ["parent:", "-", "starter:", "member:bob"]
    offered = {t["function"]["name"] for r in vendor.requests if "tools" in (r["body"] or {})
               for t in r["body"]["tools"] if "function" in t}
    assert {"agent_run", "agent_status"} <= offered  # the orchestrator's model was offered agent/v1
    assert INVOICE in json.dumps(vendor.requests[-1]["body"])  # and read the researcher's result
