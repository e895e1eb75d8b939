"""Agent runs end to end (docs/agents.md): a member starts an orchestrator from the command line, whose model (a
loopback stand-in speaking OpenAI's tool-calling format) runs a researcher through `agent_run` and follows it with
`agent_status`; the researcher's model (Anthropic's format) has OCR read a scan of its scope. Both runs are
`handler-agent`, the service's own runner; `handler agent status` and `list` show the result and the tree of runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.app import UpOptions
from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import spend_report
from reconciler.governance.rulebook import to_micros
from reconciler.governance.store import Store, open_store
from reconciler.governance.store.audit import read_audit
from reconciler.router.server import Router
from tests.fixtures.agents_tree import processes_of, write_agents_tree
from tests.fixtures.harness import RawClient, body, log_lines, run, serving, shipped_tree, short_dir
from tests.fixtures.service import running
from tests.fixtures.vendors import Reply, anthropic_reply, let_llm_reach, openai_reply, serving_vendor

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ASKED = "What is the invoice number of invoice.pdf?"
INVOICE = "INV-2024-0042"  # what the OCR conformance scan reads


@pytest.fixture
def tree() -> Iterator[Path]:
    """The shipped catalog and config (its org: alice, an owner, and bob, a member) in a short folder."""
    with shipped_tree() as root:
        yield root


def _model_bindings(root: Path, url: str) -> None:
    """llm-openai and llm-anthropic both reach the stand-in (the built-in llm's egress lists it)."""
    entry = let_llm_reach(root, url)
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


def test_a_member_runs_an_orchestrator_that_runs_a_researcher_reading_a_scan(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "key-from-a-reference")
    models = Models()
    with serving_vendor() as vendor, short_dir() as short:
        vendor.script = models
        _model_bindings(tree, vendor.url)
        _agents(tree)
        options = UpOptions(root=str(tree), run_dir=short / "run", state_dir=short / "state", http_port=0)
        where = ("--root", str(tree), "--state-dir", str(short / "state"))

        async def scenario() -> tuple[str, str, str]:
            async with running(options):
                code, out, err = await _cli("run", "orchestrator", "--input", "Find the invoice's number.", "--as",
                                            "bob", "--format", "json", *where)
                assert code == 0, err
                started = json.loads(out)
                assert (started["status"], started["starter"], started["parent"]) == ("running", "member:bob", None)
                status = await _ended(started["run"], where)
                code, listed, err = await _cli("list", *where)
                assert code == 0, err
                return started["run"], status, listed

        orchestrator, status, listed = run(scenario(), timeout=200)
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


# --- a run that ends while one of its calls is in flight: its spend is settled ---------------------------------

PRICE = 0.25  # echo_misbehave's price on echo-local: what a call the connector had and never answered is charged
CAP = 1.0  # the worker's monthly cap: the three runs' calls and exactly one more

# The worker's runner (a file of the test's tree, so a sandboxed run reads it): it calls echo_misbehave through its
# profile's bridge, a call the connector holds and does not answer for a minute; `crash`: once the test has written
# `crash` in its scope (the call has arrived), it exits at once, its call still in flight; else it waits for it.
CALLER = '''import asyncio, json, os, sys
from pathlib import Path
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(task):
    servers = json.loads(Path(os.environ["HANDLER_MCP_CONFIG"]).read_text())["mcpServers"]
    async with stdio_client(StdioServerParameters(**servers["echo"])) as (r, w), ClientSession(r, w) as echo:
        await echo.initialize()
        call = asyncio.create_task(echo.call_tool("echo_misbehave", {"mode": "held", "seconds": 60}))
        while task == "crash" and not Path("crash").exists():
            await asyncio.sleep(0.02)
        if task == "crash":
            print("worker: lost its footing mid-call", file=sys.stderr, flush=True)
            os._exit(3)
        await call


asyncio.run(main(sys.argv[-1]))
'''


def _spend_tree(root: Path) -> Path:
    """The agents tree, the worker capped at `CAP` and running `CALLER`; echo_misbehave priced `PRICE`."""
    write_agents_tree(root)
    (root / "caller.py").write_text(CALLER)
    binding = root / "config/bindings/echo-local.toml"
    priced = binding.read_text().replace("echo_say = 0.001\n", f"echo_say = 0.001\necho_misbehave = {PRICE}\n")
    binding.write_text(priced)
    (root / "config/profiles/worker.toml").write_text(
        'apiVersion = "handler.profile/v1"\nname = "worker"\nscope = "work/worker"\ntemplate = "permissive"\n'
        f'services = {{ echo = "echo-local" }}\n\n[caps]\nmonthly_usd = {CAP}\n\n'
        f'[runner]\ncommand = {json.dumps([sys.executable, str(root / "caller.py")])}\ntimeoutSeconds = 8\n')
    return root


async def _until(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Wait for `check()` to hold, up to a deadline; past it, fail saying `what` did not happen."""
    try:
        async with asyncio.timeout(seconds):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"{what} did not happen within {seconds:g} s")


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def _logged(router: Router, run_id: str) -> dict[str, Any]:
    """The call log's line of the run's echo_misbehave, once the call ended (and was settled)."""
    found: list[dict[str, Any]] = []

    def ended() -> bool:
        found[:] = [line for line in log_lines(router) if line["instance"] == run_id
                    and line["tool"] == "echo_misbehave"]
        return bool(found)

    await _until(ended, f"the call of run {run_id} ending in the call log")
    return found[0]


def _arrived(router: Router) -> int:
    """How many held calls reached the echo connector: it says so on stderr, which its binding's log keeps."""
    log = router.state_dir / "connectors/echo-local.stderr.log"
    return log.read_text().count("echo_misbehave held: call") if log.exists() else 0


async def _mid_call(boss: RawClient, router: Router, root: Path, ending: str) -> tuple[dict[str, Any], Any]:
    """A worker run started by the boss's agent, ended (`ending`) while its priced call is at the connector: what
    agent_status says of it once ended, and the call log's line of that call."""
    before = _arrived(router)
    started = body(await boss.call("agent_run", {"agent": "worker", "input": ending},
                                   _meta={"handler/instance": "boss-1"}))
    run = router.runs.runs[started["run"]]
    await _until(lambda: _arrived(router) > before or run.status != "running", "the run's call reaching the connector")
    assert _arrived(router) > before, f"the run's call never reached the connector: {run}"
    if ending == "cancel":
        assert body(await boss.call("agent_cancel", {"run": run.id}))["status"] == "cancelled"
    elif ending == "crash":
        (root / "work/worker/crash").write_text("now")
    await _until(lambda: run.status != "running", f"the run ending ({ending})")
    assert run.process is not None
    await _until(lambda: _group_gone(run.process.pid), "its process group ending", 10.0)  # type: ignore[union-attr]
    # nor any process of it elsewhere: its bridge, its sandbox's
    await _until(lambda: not processes_of(run.id), f"every process of {run.id} ending", 10.0)
    ended = body(await boss.call("agent_status", {"run": run.id}))
    return ended, await _logged(router, run.id)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'state' / 'handler.db'}")
    yield opened
    opened.close()


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "no-sandbox"])
def test_a_run_ending_mid_call_leaves_no_process_and_its_spend_settled(tmp_path: Path, sqlite_store: Store,
                                                                       run_dir: Path, sandbox: bool) -> None:
    """Cancelled, crashed, or past its time while its capped call is at the connector: each run ends with its status
    and cause and its process group gone, its call is charged what it may have cost (its price: the connector had
    it), and the cap's room is what the calls charged: exactly one more call fits, none stays reserved."""
    root = _spend_tree(tmp_path / "tree")

    async def scenario() -> dict[str, tuple[dict[str, Any], Any]]:
        governor = GovernedGate(sqlite_store, owns_store=False)
        try:
            async with serving(root, run_dir, gate=governor, sandbox=sandbox) as router:
                boss = await RawClient.connect(router.socket_path("boss"))
                worker = await RawClient.connect(router.socket_path("worker"))
                try:
                    ended = {ending: await _mid_call(boss, router, root, ending)
                             for ending in ("cancel", "crash", "time out")}
                    fits = await worker.call("echo_misbehave", {"mode": "cost"})
                    over = await worker.call("echo_misbehave", {"mode": "cost"})
                    ended["room"] = (fits["_meta"], over)
                    return ended
                finally:
                    await boss.close()
                    await worker.close()
        finally:
            await governor.aclose()

    ended = run(scenario(), timeout=150)
    cancelled, crashed, timed = (ended[e][0] for e in ("cancel", "crash", "time out"))
    assert (cancelled["status"], cancelled["error"]) == ("cancelled", "cancelled by the agent of profile 'boss'")
    assert (crashed["status"], crashed["error"]) == ("failed", "its runner exited with status 3: worker: lost its "
                                                    "footing mid-call")
    assert (timed["status"], timed["error"]) == ("timed_out", "it ran past its runner's 8 s limit")
    for ending in ("cancel", "crash", "time out"):
        line = ended[ending][1]
        assert (line["outcome"], line["cost"]) == ("cancelled", PRICE), line
    fits, over = ended["room"]
    assert (fits["handler/status"], fits["handler/cost"]) == ("executed", PRICE)
    assert over["_meta"]["handler/status"] == "blocked"
    assert "cap" in body(over)["message"]
    (worker,) = [row for row in spend_report(sqlite_store) if row["scope"] == "profile:worker"]
    assert (worker["micros"], worker["leased"], worker["stale"]) == (to_micros(CAP), 0, 0)
    trail = [r for r in read_audit(sqlite_store, limit=1000) if r["profile"] == "worker"]
    released = [r["detail"] for r in trail if r["event"] == "released"]
    assert (sum(d.get("calls", 1) for d in released), sum(d["charged"] for d in released)) == (3, to_micros(3 * PRICE))
