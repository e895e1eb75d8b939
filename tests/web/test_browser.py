"""The dashboard in a real browser (headless Chromium on a 390 px phone screen) against a real `handler up`:
an owner signs in with `handler dashboard login`, creates a binding through a connector's form (git: a new
branch pushed, the followed ref untouched), swaps a profile's binding with its dropdown (work tree: the file
written with its comments, and the router serving the new binding), sees a binding that cannot start red on its
page and marked in the dropdown, approves a hold (the held call then runs), reads what happened (the audit trail
filtered to one profile, spend against a cap, a failed call's cause), and in git mode makes a Restrictive profile
and a per-action rule from a profile's page, each a branch the changes page lists with its diff. Every page is
photographed (`artifacts/screenshots/<test>/`) and must fit the phone's width."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.browser import HandlerUp, Phone, call_tool, clean_env, handler_up, sign_in
from tests.fixtures.echo_tree import OWNED_ORG, TOKEN_ENV, add_other_binding, governed_profile, write_echo_tree
from tests.fixtures.harness import short_dir

# The first test of a process also starts Chromium (tests.fixtures.browser.LAUNCH_DEADLINE): a bound on a hang.
pytestmark = pytest.mark.timeout(300)

Git = Callable[..., str]
OnPhone = Callable[[Callable[[Phone], Any]], Any]
OTHER_ENV = "HANDLER_TEST_OTHER_TOKEN"


@pytest.fixture
def base() -> Iterator[Path]:
    with short_dir() as folder:
        yield folder


def wait_for(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def upstream_of_echo_tree(base: Path, git: Git) -> Path:
    """A bare repository whose main holds the echo tree, as a service in git mode follows it."""
    source = write_echo_tree(base / "src")
    git(source, "init", "-q")
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "the echo tree")
    upstream = base / "upstream.git"
    git(base, "clone", "-q", "--bare", str(source), str(upstream))
    return upstream


def test_an_owner_creates_a_binding_through_the_form_and_it_lands_on_a_new_branch(
        base: Path, git: Git, on_phone: OnPhone) -> None:
    upstream = upstream_of_echo_tree(base, git)
    main_before = git(upstream, "rev-parse", "main")
    env = clean_env(**{TOKEN_ENV: "a", "HANDLER_RUN_DIR": str(base / "run")})
    state = base / "state"
    with handler_up(["--source", "git", "--ref", "main", str(upstream), "--state-dir", str(state)], env,
                    cwd=base) as up:

        def flow(phone: Phone) -> str:
            page = phone.page
            page.goto(up.url + "/catalog")
            phone.snap("catalog-before-sign-in")  # nobody signed in: how to sign in, and nothing of the config
            assert "handler dashboard login --member NAME" in page.inner_text("main")
            assert page.get_by_role("link", name="new binding").count() == 0
            sign_in(phone, up, "owner", "--state-dir", str(state))
            page.get_by_role("link", name="new binding").click()
            phone.snap("connector")

            # The required token left empty: refused with the finding and its fix; nothing is committed.
            page.fill("#binding-name", "echo-new")
            page.fill("#binding-description", "The echo, with its own token")
            page.fill("#setting-greeting", "bonjour")
            page.get_by_role("button", name="Commit to a new branch and push it").click()
            phone.snap("refused")
            outcome = page.inner_text(".outcome")
            assert outcome.startswith("Not committed"), outcome
            finding = page.inner_text("table.findings .finding")
            assert "B002" in finding
            assert 'fix: secrets = { token = { env = "ECHO_TOKEN" } }' in finding
            assert git(upstream, "branch", "--list", "handler/*") == ""

            page.go_back()
            page.fill("#binding-name", "echo-new")
            page.fill("#binding-description", "The echo, with its own token")
            page.select_option("select[name='secret.token.kind']", "env")
            page.fill("#secret-token-name", "ECHO_NEW_TOKEN")
            page.fill("#setting-greeting", "bonjour")
            page.get_by_role("button", name="Commit to a new branch and push it").click()
            phone.snap("committed")
            return page.inner_text(".outcome .branch")

        branch = on_phone(flow)

    assert branch.startswith("handler/binding-echo-new-")
    assert git(upstream, "rev-parse", "main") == main_before  # the followed ref never moves
    assert git(upstream, "branch", "--list", "handler/*").strip() == branch
    assert git(upstream, "rev-parse", f"{branch}~1") == main_before
    assert git(upstream, "diff", "--name-only", "main", branch) == "config/bindings/echo-new.toml"
    assert git(upstream, "show", f"{branch}:config/bindings/echo-new.toml") == (
        'apiVersion = "handler.binding/v1"\n'
        'name = "echo-new"\n'
        'connector = "echo"\n'
        'description = "The echo, with its own token"\n'
        'secrets = { token = { env = "ECHO_NEW_TOKEN" } }\n'
        'settings = { greeting = "bonjour" }'
    )
    assert git(upstream, "log", "-1", "--format=%an <%ae>|%s", branch) == (
        "owner <owner@example.org>|Add binding echo-new of connector echo")


def test_an_owner_swaps_a_profiles_binding_with_the_dropdown_and_the_router_serves_it(
        base: Path, on_phone: OnPhone) -> None:
    root = add_other_binding(write_echo_tree(base / "t"), OTHER_ENV)
    profile = root / "config/profiles/tester.toml"
    profile.write_text("# The agent that tests the router.\n"
                       + profile.read_text().replace("services =", "# Which binding serves echo:\nservices =")
                       + "# end of the profile\n")
    before = profile.read_text()
    env = clean_env(**{TOKEN_ENV: "local-token", OTHER_ENV: "other-token", "HANDLER_RUN_DIR": str(base / "run")})
    sock = base / "run/profiles/tester.sock"
    with handler_up([str(root)], env, cwd=root) as up:
        assert call_tool(sock, "echo_token", {}) == {"token": "local-token"}

        def swap(phone: Phone) -> str:
            page = phone.page
            sign_in(phone, up, "owner", "--root", str(root))
            page.goto(up.url + "/")
            page.get_by_role("link", name="tester").click()
            phone.snap("profile")
            page.select_option("#use-echo", "echo-other")
            page.get_by_role("button", name="Save to the work tree").click()
            phone.snap("saved")
            assert "Wrote config/profiles/tester.toml" in page.inner_text(".outcome")
            return page.inner_text("pre.plan")

        plan = on_phone(swap)
        assert "echo: echo-local (echo/v1" in plan
        assert "→ echo-other (echo/v1" in plan
        assert profile.read_text() == before.replace('echo = "echo-local"', 'echo = "echo-other"')
        wait_for(lambda: call_tool(sock, "echo_token", {}) == {"token": "other-token"}, "the new binding to serve")

        def drill_down(phone: Phone) -> str:  # overview → profile's binding → its connector → its interface
            page = phone.page
            sign_in(phone, up, "owner", "--root", str(root))
            page.goto(up.url + "/")
            phone.snap("overview")
            page.locator("a[href='/bindings/echo-other']").first.click()
            phone.snap("binding")
            page.get_by_role("link", name="echo", exact=True).first.click()
            phone.snap("connector")
            page.get_by_role("link", name="echo/v1").first.click()
            phone.snap("catalog")
            return page.url

        assert on_phone(drill_down).endswith("/catalog#echo/v1")


def test_a_binding_whose_secret_is_missing_is_red_on_its_page_and_the_profile_form_warns_before_swapping_to_it(
        base: Path, on_phone: OnPhone) -> None:
    """The service lacks echo-other's token (its environment, not this one's): the binding's page is red with the
    finding and its fix, the dropdown marks it, and the check of the swap warns before anything is written."""
    root = add_other_binding(write_echo_tree(base / "t"), OTHER_ENV)
    profile = root / "config/profiles/tester.toml"
    before = profile.read_text()
    env = clean_env(**{TOKEN_ENV: "local-token", "HANDLER_RUN_DIR": str(base / "run")})  # and no OTHER_ENV
    with handler_up([str(root)], env, cwd=root) as up:

        def look(phone: Phone) -> tuple[str, str, str, str]:
            page = phone.page
            sign_in(phone, up, "owner", "--root", str(root))
            page.goto(up.url + "/bindings/echo-other")
            phone.snap("binding-cannot-start")
            health = page.locator(".health.down")
            colour = health.evaluate("e => getComputedStyle(e).backgroundColor")
            finding = page.inner_text("table.health-findings")
            page.goto(up.url + "/profiles/tester")
            phone.snap("profile-marks-it")
            option = page.inner_text("#use-echo option[value='echo-other']")
            page.select_option("#use-echo", "echo-other")
            page.get_by_role("button", name="Check only").click()
            phone.snap("check-warns")
            return colour, finding, option, page.inner_text("main")

        colour, finding, option, checked = on_phone(look)
        assert colour == "rgb(251, 217, 217)"  # red
        assert f"secret slot 'token': the router's environment has no {OTHER_ENV}" in finding
        assert f"export {OTHER_ENV}=... in the service's environment before it starts" in finding
        assert option.startswith("⚠ echo-other"), option
        assert option.endswith("cannot start now"), option
        assert "But the running service warns of it" in checked
        assert "echo would be served by echo-other, which cannot start on the running service now" in checked
        assert profile.read_text() == before


def test_an_owner_approves_a_hold_and_the_held_call_runs(base: Path, on_phone: OnPhone) -> None:
    root = write_echo_tree(base / "t")
    profile = root / "config/profiles/tester.toml"
    profile.write_text(profile.read_text().replace('template = "permissive"\n', ""))  # Balanced: a write waits
    env = clean_env(**{TOKEN_ENV: "t", "HANDLER_RUN_DIR": str(base / "run")})
    with handler_up([str(root)], env, cwd=root) as up:
        held = call_tool(base / "run/profiles/tester.sock", "echo_write",
                         {"text": "approved by a person", "outputPath": "note.txt"})
        assert held["status"] == "pending", held

        def approve(phone: Phone) -> str:
            page = phone.page
            sign_in(phone, up, "owner", "--root", str(root))
            page.goto(up.url + "/approvals")
            phone.snap("approvals")
            page.get_by_role("link", name=held["request_id"]).first.click()
            phone.snap("hold")
            page.get_by_role("button", name="Approve as owner").click()
            page.locator("dd.run .state.executed").wait_for(timeout=30_000)  # the page follows the run
            phone.snap("executed")
            return page.inner_text("dd.run")

        assert on_phone(approve).startswith("executed at")
    assert (root / "work/tester/note.txt").read_text() == "approved by a person"


def test_an_operator_reads_the_audit_trail_spend_against_a_cap_and_a_failed_calls_cause(
        base: Path, on_phone: OnPhone) -> None:
    root = write_echo_tree(base / "t")
    (root / "config/org.toml").write_text(OWNED_ORG)
    (root / "config/profiles/tester.toml").write_text(governed_profile(monthly_usd=0.01))  # echo_write waits
    env = clean_env(**{TOKEN_ENV: "t", "HANDLER_RUN_DIR": str(base / "run")})
    sock = base / "run/profiles/tester.sock"
    with handler_up([str(root)], env, cwd=root) as up:
        assert call_tool(sock, "echo_say", {"text": "hello"}) == {"text": "hello"}  # priced: spend against the cap
        held = call_tool(sock, "echo_write", {"text": "dear bob", "outputPath": "mail.txt"})
        assert held["status"] == "pending", held
        failed = call_tool(sock, "echo_misbehave", {"mode": "wrong_type"})
        assert failed["error"] == "unavailable", failed

        def read(phone: Phone) -> tuple[str, str, str, str]:
            page = phone.page
            sign_in(phone, up, "owner", "--root", str(root))
            page.get_by_role("link", name="Audit", exact=True).click()
            page.fill("input[name='profile']", "tester")
            page.get_by_role("button", name="Filter").click()
            phone.snap("audit-filtered")
            page.locator(f"a[href='/approvals/{held['request_id']}']").first.click()
            page.wait_for_url(f"**/approvals/{held['request_id']}")
            phone.snap("the-held-call")
            hold = page.inner_text("main")
            page.get_by_role("link", name="Spend", exact=True).click()
            phone.snap("spend")
            line = page.locator("table.spend tr", has_text="profile tester")
            spent = line.inner_text() + f" cap-line:{line.locator('svg line').count()}"
            page.get_by_role("link", name="Calls", exact=True).click()
            page.get_by_role("link", name="Only those that did not execute").click()
            for _ in range(100):  # the call log is written in batches: the page shows a call once it is flushed
                if "echo_misbehave" in page.inner_text("main"):
                    break
                time.sleep(0.1)
                page.reload()
            phone.snap("failed-calls")
            calls = page.locator("tr", has_text="echo_misbehave").first.inner_text()
            return page.url, hold, spent, calls

        url, hold, spent, calls = on_phone(read)
    assert url.endswith("/calls?outcome=failed")
    assert "echo_write" in hold
    assert "dear bob" in hold  # a signed-in member reads the held call's arguments
    assert "tester" in spent
    assert "$0.01" in spent  # the cap beside what was spent
    assert spent.endswith("cap-line:1")  # the month's bar against the cap's line, drawn on the server
    assert "unavailable · output_invalid" in calls  # the failed call's cause
    assert "echo-local" in calls


def govern_from_the_profile_page(phone: Phone, up: HandlerUp, state: Path) -> dict[str, str]:
    """An owner makes a Restrictive profile, then a rule, each from the plan to its confirm; what each page said."""
    page = phone.page
    seen: dict[str, str] = {}
    sign_in(phone, up, "owner", "--state-dir", str(state))
    page.goto(up.url + "/profiles/tester#governance")
    phone.snap("profile-governance")
    page.fill("#create-name", "reviewer")
    page.select_option("#create-template", "restrictive")
    page.check("#create-copy")
    page.get_by_role("button", name="Show the plan of the new profile").click()
    phone.snap("new-profile-plan")
    seen["profile-plan"] = page.inner_text("pre.plan")
    seen["profile-explained"] = page.inner_text("main")
    page.get_by_role("button", name="Commit to a new branch and push it").click()
    phone.snap("new-profile-committed")
    seen["profile-branch"] = page.inner_text(".outcome .branch")

    page.goto(up.url + "/profiles/tester#governance")
    page.select_option("#rule-target", "action:echo_write")
    page.select_option("#rule-outcome", "block")
    page.get_by_role("button", name="Show the plan of the rule").click()
    phone.snap("rule-plan")
    seen["rule-explained"] = page.inner_text("pre.explain")
    page.get_by_role("button", name="Commit to a new branch and push it").click()
    phone.snap("rule-committed")
    seen["rule-branch"] = page.inner_text(".outcome .branch")

    page.get_by_role("link", name="Changes", exact=True).click()
    phone.snap("changes")
    seen["changes"] = page.inner_text("main")
    return seen



def test_in_git_mode_an_owner_makes_a_restrictive_profile_and_a_rule_from_the_profile_page_each_a_branch(
        base: Path, git: Git, on_phone: OnPhone) -> None:
    """Each form shows the plan and what `handler explain` would then say before the owner confirms it; each
    confirm is a branch pushed, and the changes page lists both open proposals with their diffs."""
    upstream = upstream_of_echo_tree(base, git)
    main_before = git(upstream, "rev-parse", "main")
    env = clean_env(**{TOKEN_ENV: "a", "HANDLER_RUN_DIR": str(base / "run")})
    state = base / "state"
    with handler_up(["--source", "git", "--ref", "main", str(upstream), "--state-dir", str(state)], env,
                    cwd=base) as up:

        seen = on_phone(lambda phone: govern_from_the_profile_page(phone, up, state))
    assert "profile reviewer (added)" in seen["profile-plan"]
    assert "template: (none) → restrictive" in seen["profile-plan"]
    assert "echo_write on profile reviewer" in seen["profile-explained"]  # what the new agent's calls get
    assert seen["rule-explained"].startswith("echo_write on profile tester at")
    assert "blocked (decision: block)" in seen["rule-explained"]
    made, ruled = seen["profile-branch"], seen["rule-branch"]
    assert made.startswith("handler/profile-reviewer-")
    assert ruled.startswith("handler/profile-tester-rule-")
    assert git(upstream, "rev-parse", "main") == main_before  # the followed ref never moves
    assert 'template = "restrictive"' in git(upstream, "show", f"{made}:config/profiles/reviewer.toml")
    assert git(upstream, "show", f"{ruled}:config/profiles/tester.toml").endswith(
        '[[rules]]\naction = "echo_write"\noutcome = "block"')
    changes = seen["changes"]
    assert "Proposed from the dashboard, not merged (2)" in changes
    assert made in changes
    assert ruled in changes
    assert '+template = "restrictive"' in changes  # each proposal's diff
    assert '+action = "echo_write"' in changes
