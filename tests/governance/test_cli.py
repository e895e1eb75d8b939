"""The governance commands end to end: explain, approvals, audit, balance, spend, store migrate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.config import FolderSource, Loader
from reconciler.governance.governed import GovernedGate
from reconciler.governance.holds import claim_hold, get_hold
from reconciler.governance.leases import LeaseTerms
from reconciler.governance.store import open_store, store_url
from reconciler.governance.store.audit import record
from tests.governance.builders import OWNERS_ORG, cap_snapshot, hold_calls, make_snapshot, priced_call
from tests.governance.store.test_set_aside import refuse_a_row


@pytest.fixture
def tree(shipped_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("HANDLER_STORE_URL", raising=False)
    monkeypatch.delenv("HANDLER_STATE_DIR", raising=False)
    return shipped_tree


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_json_has_the_documented_keys(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", str(tree), "--profile", "auditor", "--tool", "web_search_query",
                       "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert {"decision", "status", "approver", "reason", "trace"} <= set(doc)
    assert doc["decision"] == "approve"
    assert doc["status"] == "pending"
    assert doc["approver"] == {"to": "member", "member": "alice"}
    assert [s["layer"] for s in doc["trace"]][:3] == ["guardrails", "rule", "template"]
    assert not (tree / ".handler").exists()  # explain reads the store; it never creates one


def test_explain_text_and_a_cost_over_the_cap(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", str(tree), "--profile", "researcher", "--tool", "web_search_query",
                       "--cost", "6", "--instance", "run-1")
    assert code == 0
    assert "blocked (decision: block)" in out
    assert "instance cap of instance run-1 of profile researcher" in out
    code, out, _ = run(capsys, "explain", str(tree), "--profile", "researcher", "--tool", "web_search_query",
                       "--cost", "2")
    assert "pending" in out
    assert "policy 'expensive calls to alice'" in out


def test_explain_names_what_exists_when_a_name_is_wrong(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "explain", str(tree), "--profile", "asistant", "--tool", "x")
    assert code == 1
    assert "did you mean 'assistant'" in err


def test_an_approval_a_router_runs_at_once_is_said_to_be_an_approval(tree: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A router woken by the decision may claim the hold before the command reads it back: it said "rejected"."""
    import reconciler.cli.governance as governance_cli

    (rid,) = hold_calls(tree, 1)
    decide = governance_cli.decide_hold

    def claimed_at_once(store: object, request_id: str, *args: object, **kwargs: object) -> object:
        decide(store, request_id, *args, **kwargs)  # type: ignore[arg-type]
        assert claim_hold(store, request_id, "router-elsewhere")  # type: ignore[arg-type]
        return get_hold(store, request_id)  # type: ignore[arg-type]

    monkeypatch.setattr(governance_cli, "decide_hold", claimed_at_once)
    code, out, _ = run(capsys, "approvals", "approve", rid, "--as", "alice", "--root", str(tree))
    assert code == 0
    assert out.startswith(f"{rid} approved by alice: a running router runs it now"), out


def test_approve_as_a_member_runs_nothing_itself_and_is_audited(tree: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = Loader().load(FolderSource(tree))
    store = open_store(store_url(tree))
    governor = GovernedGate(store)
    call = priced_call("run-1", profile="auditor", tool="web_search_query", query="acme invoices")
    call = type(call)(call.profile, call.instance, None, "web-search/v1", call.tool, "search-brave", call.arguments)
    rid = governor.admit_now(snapshot, call).request_id
    governor.close()
    assert rid is not None

    code, out, _ = run(capsys, "approvals", "list", "--root", str(tree))
    assert rid in out
    monkeypatch.setenv("HANDLER_ROOT", str(tree))
    assert run(capsys, "approvals") == (0, out, "")  # no action named: the list, with its defaults
    code, out, _ = run(capsys, "approvals", "show", rid, "--root", str(tree))
    assert "acme invoices" in out
    assert "alice" in out
    assert "notice:    email to alice@example.org: pending after 0 attempts" in out  # `handler up` sends it

    code, _, err = run(capsys, "approvals", "approve", rid, "--as", "bob", "--root", str(tree))
    assert code == 1
    assert "routed to member alice" in err
    code, _, err = run(capsys, "approvals", "approve", rid, "--as", "mallory", "--root", str(tree))
    assert code == 1
    assert "not a member" in err
    code, out, _ = run(capsys, "approvals", "approve", rid, "--as", "alice", "--root", str(tree))
    assert code == 0
    assert "approved by alice" in out
    code, _, err = run(capsys, "approvals", "reject", rid, "--as", "alice", "--root", str(tree))
    assert code == 1
    assert "already decided" in err

    check = open_store(store_url(tree))
    try:
        hold = get_hold(check, rid)
    finally:
        check.close()
    assert hold.state == "approved"
    assert hold.decided_by == "alice"
    code, out, _ = run(capsys, "audit", "--root", str(tree), "--request", rid, "--format", "json")
    events = [(r["event"], r["actor"]) for r in json.loads(out)]
    assert events == [("decided", None), ("approved", "alice")]


def test_reject_with_a_reason_shows_it_to_the_agent_the_hold_and_the_audit_trail(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = Loader().load(FolderSource(tree))
    store = open_store(store_url(tree))
    governor = GovernedGate(store)
    call = priced_call("run-1", profile="auditor", tool="web_search_query", query="acme invoices")
    call = type(call)(call.profile, call.instance, None, "web-search/v1", call.tool, "search-brave", call.arguments)
    rid = governor.admit_now(snapshot, call).request_id
    governor.close()
    assert rid is not None

    code, _, err = run(capsys, "approvals", "reject", rid, "--as", "alice", "--root", str(tree), "--reason", "x" * 2001)
    assert code == 1
    assert "at most 2000" in err
    code, out, _ = run(capsys, "approvals", "reject", rid, "--as", "alice", "--root", str(tree),
                       "--reason", "use the archive instead")
    assert code == 0
    assert f"{rid} rejected by alice: use the archive instead." in out
    code, out, _ = run(capsys, "approvals", "show", rid, "--root", str(tree))
    assert "decided:   rejected by alice at " in out
    assert out.split("decided:", 1)[1].splitlines()[0].endswith(": use the archive instead")
    code, out, _ = run(capsys, "approvals", "show", rid, "--root", str(tree), "--format", "json")
    assert json.loads(out)["decision_reason"] == "use the archive instead"
    code, out, _ = run(capsys, "audit", "--root", str(tree), "--request", rid)
    assert "rejected by alice: use the archive instead" in out.splitlines()[-1]


def test_audit_lists_the_entries_of_one_event(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(store_url(tree))
    try:
        with store.begin() as tx:
            record(tx, "pricing_violation", profile="auditor", tool="web_search_query",
                   detail={"binding": "search-brave", "reported": 2_000_000, "reserved": 10_000})
        refuse_a_row(store)
    finally:
        store.close()
    code, out, _ = run(capsys, "audit", "--root", str(tree), "--event", "set_aside")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 1
    assert "set_aside" in lines[0]
    assert "pricing_violation" not in out
    assert "too large" in lines[0]  # the store's reason
    code, out, _ = run(capsys, "audit", "--root", str(tree), "--event", "set_aside", "--format", "json")
    assert [row["detail"]["what"] for row in json.loads(out)] == ["spend sum"]
    code, out, _ = run(capsys, "audit", "--root", str(tree), "--event", "approved", "--request", "req_none")
    assert out.strip() == "No entries of event approved and request req_none in the audit trail."


def test_balance_spend_and_migrate(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "store", "migrate", "--root", str(tree))
    assert code == 0
    assert "schema at revision 0009" in out  # the newest migration
    code, out, _ = run(capsys, "balance", "show", "--root", str(tree))
    assert "$0.00" in out
    code, out, _ = run(capsys, "balance", "add", "12.5", "--as", "alice", "--root", str(tree))
    assert "balance now $12.50" in out
    code, out, _ = run(capsys, "spend", "--root", str(tree))
    assert out.startswith("No spend")
    code, out, _ = run(capsys, "audit", "--root", str(tree))
    assert "balance" in out


@pytest.mark.parametrize("amount", ["nan", "inf", "1e300", "-2000000000", "0", "0.0000001", "twelve"])
def test_an_amount_that_is_not_money_is_refused_before_the_store_is_touched(
        tree: Path, capsys: pytest.CaptureFixture[str], amount: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["balance", "add", amount, "--as", "alice", "--root", str(tree)])
    assert exited.value.code == 2
    assert f"'{amount}' is not an amount to add" in capsys.readouterr().err
    assert not (tree / ".handler").exists()


def test_the_balance_changes_only_as_a_member_and_the_trail_shows_each_change(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "balance", "add", "5", "--as", "alcie", "--root", str(tree))
    assert code == 1
    assert "'alcie' is not a member of org acme in config/org.toml (its members: alice, bob)" in err
    assert not (tree / ".handler").exists()  # refused before the store was made
    run(capsys, "balance", "add", "5", "--as", "alice", "--root", str(tree))
    code, out, _ = run(capsys, "balance", "add", "-2", "--as", "bob", "--root", str(tree))
    assert out == "acme: balance now $3.00 (corrected down by $2.00 by bob)\n"
    _, out, _ = run(capsys, "audit", "--root", str(tree))
    assert [line.split("  ", 1)[1].split() for line in out.splitlines()] == [
        ["balance", "-", "by", "alice", "acme:", "added", "$5.00,", "now", "$5.00"],
        ["balance", "-", "by", "bob", "acme:", "corrected", "down", "by", "$2.00,", "now", "$3.00"]]
    _, out, _ = run(capsys, "audit", "--limit", "0", "--root", str(tree))  # 0: every entry, as approvals list takes it
    assert len(out.splitlines()) == 2


@pytest.mark.parametrize(("argv", "said"), [
    (["spend", "--month", "2026-13"], "'2026-13' is not a month: give it as YYYY-MM"),
    (["spend", "--month", "last"], "'last' is not a month"),
    (["audit", "--limit", "-5"], "'-5' is not a limit"),
    (["audit", "--limit", "9" * 20], "is not a limit: give a whole number up to 1,000,000,000 (0: no limit)"),
    (["validate", "--base", ""], "the ref is empty: name a branch, a tag or a commit"),
    (["plan", "--base", " "], "the ref is empty"),
    (["explain", "--profile", "researcher", "--tool", "web_search_query", "--cost", "nan"], "'nan' is not a cost"),
    (["explain", "--profile", "researcher", "--tool", "web_search_query", "--cost", "-5"], "'-5' is not a cost"),
    (["up", "--source", "git", "--interval", "0"], "'0' is not an interval: give seconds from 1"),
])
def test_a_month_a_count_a_cost_or_an_interval_that_means_nothing_is_a_usage_error(
        tree: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--root", str(tree)])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_spend_says_what_budget_leases_hold(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(store_url(tree))

    async def scenario() -> str:
        governor = GovernedGate(store, owns_store=False, leases=LeaseTerms(idle_seconds=3600))
        try:
            admitted = await governor.admit(cap_snapshot(), priced_call())  # a router holds a lease: not settled
            _, out, _ = run(capsys, "spend", "--root", str(tree))
            await governor.settle(admitted, None, True)
            return out
        finally:
            await governor.aclose()

    try:
        during = asyncio.run(scenario())
    finally:
        store.close()
    (line,) = [line for line in during.splitlines() if "org:acme" in line]
    assert line.endswith("$0.005 ($0.005 of it is leased to routers and not settled yet)")
    _, after, _ = run(capsys, "spend", "--root", str(tree))
    (line,) = [line for line in after.splitlines() if "org:acme" in line]
    assert line.endswith("$0.005")  # returned: what the call was charged


def test_audit_shows_how_many_calls_nothing_limits_a_row_counts(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))  # no cap, nothing held

    async def calls() -> None:
        governor = GovernedGate(open_store(store_url(tree)))
        try:
            for _ in range(3):
                admission = await governor.admit(snapshot, priced_call("run-1"))
                await governor.settle(admission, None, True)
        finally:
            await governor.aclose()

    asyncio.run(calls())
    code, out, _ = run(capsys, "audit", "--root", str(tree))
    assert code == 0
    (line,) = [line for line in out.splitlines() if "search_query" in line]
    assert " settled " in line
    assert "p search_query (3 calls)  Runs now: the permissive template maps read to auto." in line


def test_a_store_file_that_is_not_a_database_says_what_to_do(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = Path(store_url(tree).removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    database.write_bytes(b"not SQLite, but a file someone copied over it\n" * 200)
    for command in (("audit",), ("approvals", "list"), ("spend",)):
        code, _, err = run(capsys, *command, "--root", str(tree))
        assert code == 1
        assert "failed: file is not a database. The file is damaged or is not this store" in err
        assert "move the file aside (with its -wal and -shm files) and restore it from a backup" in err
        assert "Traceback" not in err


def test_a_store_in_memory_is_refused_in_one_line_asking_for_a_file(tree: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDLER_STORE_URL", "sqlite://")
    for command in (("audit",), ("approvals", "list"), ("store", "migrate")):
        code, out, err = run(capsys, *command, "--root", str(tree))
        assert (code, out) == (1, "")
        (line,) = err.splitlines()
        assert line.startswith("handler: the store URL 'sqlite://' names a SQLite database in memory")
        assert line.endswith("or unset HANDLER_STORE_URL for handler.db in the state folder")


@pytest.mark.parametrize("command", [["approvals", "list"], ["approvals", "show", "req_1"], ["audit"], ["spend"],
                                     ["balance", "show"], ["approvals", "approve", "req_1", "--as", "alice"]])
def test_a_command_that_reads_the_store_says_there_is_none_and_makes_nothing(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: list[str]) -> None:
    # A mistyped HANDLER_STORE_URL made its folder and an empty store, and the listing said "No pending holds."
    url = f"sqlite:///{tmp_path}/typo/handler.db"
    monkeypatch.setenv("HANDLER_STORE_URL", url)
    code, out, err = run(capsys, *command, "--root", str(tree))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"handler: there is no store at {url}: nothing was recorded there (the service makes its store when it "
        "starts); point HANDLER_STORE_URL or HANDLER_STATE_DIR at the store the service uses"]
    assert not (tmp_path / "typo").exists()
    monkeypatch.delenv("HANDLER_STORE_URL")
    code, _, err = run(capsys, *command, "--root", str(tree))  # the default place, before the service first ran
    assert code == 2
    assert f"there is no store at sqlite:///{tree}/.handler/handler.db" in err
    assert not (tree / ".handler").exists()


def test_a_listing_says_how_many_holds_it_leaves_out(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    held = hold_calls(tree, 5)
    code, out, err = run(capsys, "approvals", "list", "--limit", "3", "--root", str(tree))
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == held[:3]
    assert "the 3 oldest of 5 pending holds are listed; --limit 0 lists them all" in err
    code, out, err = run(capsys, "approvals", "list", "--limit", "0", "--format", "json", "--root", str(tree))
    assert [hold["id"] for hold in json.loads(out)] == held
    assert err == ""
    code, out, err = run(capsys, "approvals", "list", "--root", str(tree))  # the default lists 200: all of these
    assert len(out.splitlines()) == 5
    assert err == ""
    with pytest.raises(SystemExit) as exited:
        main(["approvals", "list", "--limit", "-1", "--root", str(tree)])
    assert exited.value.code == 2
    assert "'-1' is not a limit" in capsys.readouterr().err


def test_a_hold_running_past_a_calls_default_time_says_its_router_may_have_stopped(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After a kill -9 of the router running it, the agent read 'it is running now' for ever, and people too."""
    import sqlalchemy as sa

    from reconciler.governance.holds import decide_hold, hold_status
    from reconciler.governance.store.tables import holds

    (rid,) = hold_calls(tree, 1)
    store = open_store(store_url(tree))
    try:
        decide_hold(store, rid, "approve", "alice")
        assert claim_hold(store, rid, "router-b777ccee21fa")
        assert hold_status(get_hold(store, rid)).message.endswith("it is running now.")
        with store.begin() as tx:
            tx.execute(sa.update(holds).where(holds.c.id == rid).values(claimed_at=holds.c.claimed_at - 301))
        told = hold_status(get_hold(store, rid))
    finally:
        store.close()
    assert told.status == "pending"
    assert "the router running it may have stopped" in told.message
    assert "it is not run again" in told.message
    _, out, _ = run(capsys, "approvals", "show", rid, "--root", str(tree))
    assert "(on router-b777ccee21fa); longer than a call may by default: if that router stopped" in out
