"""A member-started run's holds on the dashboard (docs/agents.md, "Who decides a run's holds"): bob, a member who is
not an owner, starts a run with `handler agent run --as bob`; its call, held and routed to the caller, shows on bob's
approvals page (and bob is emailed, as a member a hold is routed to is) and bob approves it there, so the run goes
on and succeeds. Carol, a member who did not start it,
reads the hold and is told who decides it; her decision is refused.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.app import UpOptions
from tests.fixtures.agents_tree import MEMBERS_ORG, write_agents_tree
from tests.fixtures.harness import short_dir
from tests.fixtures.mail import serving_mailbox
from tests.fixtures.service import DEADLINE, Service, running
from tests.fixtures.signin import sign_in

HANDLER = str(Path(sys.executable).parent / "handler")


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The agents tree (the worker on Balanced, its holds routed to the caller) and the org above."""
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_SMTP_URL", "HANDLER_SLACK_TOKEN",
                 "HANDLER_SLACK_SIGNING_SECRET", "HANDLER_DASHBOARD_TOKEN", "HANDLER_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as base:
        root = write_agents_tree(base / "t", worker_template="balanced", worker_routing='routing = { to = "caller" }\n')
        (root / "config/org.toml").write_text(MEMBERS_ORG)
        yield root


async def _agent(*args: str) -> tuple[int, str, str]:
    """`handler agent ARGS`, as the member types it beside the service."""
    done = await asyncio.create_subprocess_exec(HANDLER, "agent", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await done.communicate()
    return done.returncode or 0, out.decode(), err.decode()


async def _held(root: Path, run_id: str, where: tuple[str, ...]) -> str:
    """The request id of the run's held echo_write (the runner writes it in its scope), once it is held."""
    marker = root / "work/worker/held"
    async with asyncio.timeout(60):
        while not marker.exists():
            _, out, _ = await _agent("status", run_id, *where)
            assert f"{run_id}  worker  running" in out, f"the run ended before its call was held: {out}"
            await asyncio.sleep(0.1)
    return marker.read_text()


def _csrf(page: str) -> str:
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert token is not None, page
    return token.group(1)


async def _carol_cannot_decide(url: str, root: Path, state: Path, rid: str) -> None:
    """Carol, signed in, reads the hold and who decides it; no button, and her posted decision is refused."""
    async with httpx.AsyncClient() as carol:
        await sign_in(carol, url, root, state, "carol")
        page = await carol.get(f"{url}/approvals/{rid}")
        assert page.status_code == 200, page.text
        assert "this hold is routed to member bob; carol is not an owner" in page.text
        assert "Approve as" not in page.text
        posted = await carol.post(f"{url}/approvals/{rid}", data={"csrf": _csrf(page.text), "decision": "approve"})
        assert posted.status_code == 409, posted.text
        assert "routed to member bob; carol is not an owner" in posted.text


async def _bob_approves(url: str, root: Path, state: Path, rid: str) -> None:
    """Bob, signed in, finds the hold on his approvals page and approves it there."""
    async with httpx.AsyncClient() as bob:
        await sign_in(bob, url, root, state, "bob")
        listing = await bob.get(f"{url}/approvals")
        assert listing.status_code == 200, listing.text
        assert rid in listing.text
        assert "member bob" in listing.text
        page = await bob.get(f"{url}/approvals/{rid}")
        assert "Approve as bob" in page.text
        assert "echo_write" in page.text
        done = await bob.post(f"{url}/approvals/{rid}", data={"csrf": _csrf(page.text), "decision": "approve"})
        assert done.status_code == 200, done.text
        assert "Approved by bob" in done.text


async def _ended(run_id: str, where: tuple[str, ...]) -> dict[str, object]:
    async with asyncio.timeout(DEADLINE * 2):
        while True:
            _, out, err = await _agent("status", run_id, "--format", "json", *where)
            shown = json.loads(out or "{}")
            assert shown, err
            if shown["status"] != "running":
                return shown
            await asyncio.sleep(0.1)


def _url(service: Service) -> str:
    assert service.listener is not None
    return f"http://127.0.0.1:{service.listener.port}"


def test_the_member_who_started_a_run_approves_its_hold_on_the_dashboard_and_no_other_member_can(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with short_dir() as short, serving_mailbox() as (box, port):
        monkeypatch.setenv("HANDLER_SMTP_URL", f"smtp://127.0.0.1:{port}")
        state = short / "state"
        options = UpOptions(root=str(tree), run_dir=short / "run", state_dir=state, http_port=0)
        where = ("--root", str(tree), "--state-dir", str(state))

        async def scenario() -> dict[str, object]:
            async with running(options) as service:
                code, out, err = await _agent("run", "worker", "--input", "write", "--as", "bob", "--format", "json",
                                              *where)
                assert code == 0, err
                run_id = json.loads(out)["run"]
                rid = await _held(tree, run_id, where)
                await service.until(lambda: bool(box.messages))
                (mail,) = box.messages
                assert (mail["To"], rid in mail["Subject"]) == ("bob@example.org", True)
                await _carol_cannot_decide(_url(service), tree, state, rid)
                await _bob_approves(_url(service), tree, state, rid)
                return await _ended(run_id, where)

        ended = asyncio.run(scenario())
    assert ended["status"] == "succeeded", ended
    assert ended["starter"] == "member:bob"
    told = json.loads(str(ended["result"]))
    assert told["held"] == "pending"  # what the run's agent read of its call at first
    assert told["final"]["status"] == "executed"  # and once bob approved it
    assert (tree / "work/worker/note.txt").read_text() == "hello"
