"""The dashboard's config forms with `handler up` in this loop, over HTTP: who may send them (an owner signed in
with `handler dashboard login`, and no one else, whatever the token or a decision link says), what they refuse
(a bad CSRF token, a `command` secret, a change with a finding: nothing written), and where a clean change goes
(the work tree's file, or in git mode a new branch pushed to the remote while the followed ref stays)."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from reconciler.app import UpOptions
from reconciler.cli import main
from reconciler.web.links import LinkSigner, load_link_secret
from tests.fixtures.echo_tree import OWNED_ORG, TOKEN_ENV, add_other_binding, write_echo_tree
from tests.fixtures.harness import short_dir
from tests.fixtures.service import Service, running

Git = Callable[..., str]
ORG = OWNED_ORG
BINDING = {"name": "echo-new", "description": "a second echo", "secret.token.kind": "env",
           "secret.token.name": "ECHO_NEW_TOKEN", "setting.greeting": "salut", "action": "apply"}


@pytest.fixture
def base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in ("HANDLER_STORE_URL", "HANDLER_SMTP_URL", "HANDLER_SLACK_TOKEN", "HANDLER_SLACK_SIGNING_SECRET",
                 "HANDLER_DASHBOARD_TOKEN", "HANDLER_PUBLIC_URL", "HANDLER_LINK_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(TOKEN_ENV, "t")
    with short_dir() as folder:
        monkeypatch.setenv("HANDLER_STATE_DIR", str(folder / "state"))  # `handler dashboard login` finds the key
        yield folder


@pytest.fixture
def tree(base: Path) -> Path:
    root = add_other_binding(write_echo_tree(base / "t"), TOKEN_ENV)
    (root / "config/org.toml").write_text(ORG)
    return root


def options(base: Path, root: Path | str, **more: object) -> UpOptions:
    return UpOptions(str(root), run_dir=base / "run", state_dir=base / "state", http_port=0, sandbox=False,
                     **more)  # type: ignore[arg-type]


def url(service: Service) -> str:
    assert service.listener is not None
    return f"http://127.0.0.1:{service.listener.port}"


def signer(base: Path) -> LinkSigner:
    return LinkSigner(load_link_secret(base / "state"))


def login_link(capsys: pytest.CaptureFixture[str], root: Path, service: Service, member: str = "owner") -> str:
    code = main(["dashboard", "login", "--member", member, "--root", str(root), "--url", url(service)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out.strip()


def fields_of(link: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}


async def sign_in(http: httpx.AsyncClient, link: str) -> None:
    page = await http.get(link)
    assert page.status_code == 200, page.text
    assert "Sign in as owner" in page.text
    done = await http.post("/login", data=fields_of(link))
    assert (done.status_code, done.headers["location"]) == (303, "/catalog")


def csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, page.text
    return found.group(1)


def text(page: httpx.Response) -> str:
    """The page as a person reads it: tags out, entities decoded, spaces folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.text)).split())


def test_without_an_owners_sign_in_no_form_is_shown_and_every_post_is_refused(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            page = await http.get("/connectors/echo")
            assert page.status_code == 401  # nobody signed in: the sign-in page, nothing of the config
            assert "handler dashboard login --member NAME" in text(page)
            assert 'action="/connectors/echo/bindings"' not in page.text
            refused = await http.post("/connectors/echo/bindings", data=BINDING)
            assert refused.status_code == 403
            assert "editing the config needs an owner's sign-in" in text(refused)
            refused = await http.post("/profiles/tester", data={"use.echo": "echo-other", "was.echo": "echo-local"})
            assert refused.status_code == 403
            # A member session, as a decision link gives an owner, is not a sign-in to edit.
            session = signer(base).session("owner")
            http.cookies.set("handler_member", session)
            refused = await http.post("/connectors/echo/bindings",
                                      data={**BINDING, "csrf": signer(base).csrf(session)})
            assert refused.status_code == 403
            assert "needs an owner's sign-in" in text(refused)
    asyncio.run(scenario())
    assert not (tree / "config/bindings/echo-new.toml").exists()
    assert 'echo = "echo-local"' in (tree / "config/profiles/tester.toml").read_text()


def test_a_member_who_is_no_owner_signs_in_to_read_but_cannot_edit(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "login", "--member", "mallory", "--root", str(tree)]) == 1
    assert "mallory is not a member" in capsys.readouterr().err

    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            link = login_link(capsys, tree, service, "bob")
            page = await http.get(link)
            assert page.status_code == 200
            assert "signs bob in as a member of the org" in text(page)
            done = await http.post("/login", data=fields_of(link))
            assert (done.status_code, done.headers["location"]) == (303, "/")
            assert "handler_owner" not in done.headers.get("set-cookie", "")
            shown = await http.get("/connectors/echo")  # a member reads the config's pages
            assert shown.status_code == 200
            assert 'action="/connectors/echo/bindings"' not in shown.text
            refused = await http.post("/connectors/echo/bindings", data=BINDING)
            assert refused.status_code == 403
            assert "editing the config needs an owner's sign-in" in text(refused)
            # An owner session for bob (signed while bob was an owner, say) edits nothing now he is not one.
            session = signer(base).owner_session("bob")
            http.cookies.set("handler_owner", session)
            refused = await http.post("/connectors/echo/bindings",
                                      data={**BINDING, "csrf": signer(base).csrf("owner\n" + session)})
            assert refused.status_code == 403
            assert "bob is not an owner of the org" in text(refused)
    asyncio.run(scenario())
    assert not (tree / "config/bindings/echo-new.toml").exists()


def test_a_sign_in_link_works_once_and_not_when_changed(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        async with running(options(base, tree)) as service:
            link = login_link(capsys, tree, service)
            async with httpx.AsyncClient(base_url=url(service)) as http:
                await sign_in(http, link)
                catalog = await http.get("/catalog")
                assert "signed in as owner (owner)" in text(catalog)
                token = csrf(await http.get("/connectors/echo"))
                copied = dict(http.cookies)  # what someone who read the browser's cookies would keep
                out = await http.post("/logout", data={"csrf": csrf(catalog)})
                assert (out.status_code, out.headers["location"]) == (303, "/")
                refused = await http.post("/connectors/echo/bindings", data={**BINDING, "csrf": token})
                assert refused.status_code == 403  # signed out: the form's token is worth nothing now
            async with httpx.AsyncClient(base_url=url(service), cookies=copied) as replay:
                replayed = await replay.post("/connectors/echo/bindings", data={**BINDING, "csrf": token})
                assert replayed.status_code == 403  # the copy was signed out with the browser's own
                assert "needs an owner's sign-in" in text(replayed)
                assert "signed in as" not in text(await replay.get("/catalog"))
            async with httpx.AsyncClient(base_url=url(service)) as other:
                again = await other.get(link)
                assert again.status_code == 403
                assert "this sign-in link was used already" in text(again)
                again = await other.post("/login", data=fields_of(link))
                assert again.status_code == 403
                assert "used already" in text(again)
                changed = await other.post("/login", data={**fields_of(link), "member": "bob"})
                assert changed.status_code == 403
                assert "signature does not match" in text(changed)
    asyncio.run(scenario())


def test_a_form_without_its_sessions_csrf_token_is_refused(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            for token in ({}, {"csrf": "0" * 64}):
                refused = await http.post("/connectors/echo/bindings", data={**BINDING, **token})
                assert refused.status_code == 403
                assert "the form does not belong to this session" in text(refused)
            # The token of another session does not do either.
            other = signer(base).csrf("owner\n" + signer(base).owner_session("owner", hours=1))
            refused = await http.post("/profiles/tester", data={"use.echo": "echo-other", "was.echo": "echo-local",
                                                                "csrf": other})
            assert refused.status_code == 403
    asyncio.run(scenario())
    assert not (tree / "config/bindings/echo-new.toml").exists()
    assert 'echo = "echo-local"' in (tree / "config/profiles/tester.toml").read_text()


def test_a_secret_by_command_or_by_value_is_refused_and_nothing_is_written(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/connectors/echo"))
            refused = await http.post("/connectors/echo/bindings", data={
                **BINDING, "csrf": token, "secret.token.kind": "command", "secret.token.name": "cat /run/token"})
            assert refused.status_code == 400
            assert "a command reference runs in the router, so it is not taken here" in text(refused)
            refused = await http.post("/connectors/echo/bindings", data={
                **BINDING, "csrf": token, "secret.token.name": "sk-live-51Hq"})
            assert refused.status_code == 400
            assert "never by value" in text(refused)
            assert "sk-live-51Hq" not in refused.text  # what may be the secret itself is not shown back
    asyncio.run(scenario())
    assert not (tree / "config/bindings/echo-new.toml").exists()


def test_a_change_with_a_finding_writes_nothing_and_shows_the_fix(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tree / "config/profiles/tester.toml"
    before = profile.read_text()

    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/connectors/echo"))
            refused = await http.post("/connectors/echo/bindings",
                                      data={**BINDING, "csrf": token, "secret.token.name": ""})
            assert refused.status_code == 422
            shown = text(refused)
            assert "Not written: the tree would have 1 error" in shown
            assert "B002 error config/bindings/echo-new.toml:1 required secret slot 'token'" in shown
            assert 'fix: secrets = { token = { env = "ECHO_TOKEN" } }' in shown
            token = csrf(await http.get("/profiles/tester"))
            refused = await http.post("/profiles/tester", data={"use.echo": "echo-gone", "was.echo": "echo-local",
                                                                "csrf": token, "action": "apply"})
            assert refused.status_code == 422
            assert "P001" in text(refused)
            assert "fix:" in text(refused)
            assert "has the shape of a key or token" in text(pasted := await http.post(  # a name's own characters
                "/connectors/echo/bindings", data={**BINDING, "csrf": token, "secret.token.kind": "env",
                                                   "secret.token.name": "a8Fj29Dkq0Lm3Nx7Pq1Rs5Tu"}))
            assert "a8Fj29" not in pasted.text
            checked = await http.post("/connectors/echo/bindings", data={**BINDING, "csrf": token, "action": "check"})
            assert checked.status_code == 200
            assert "The change passes every check. Nothing was written" in text(checked)
    asyncio.run(scenario())
    assert not (tree / "config/bindings/echo-new.toml").exists()
    assert profile.read_text() == before


def test_the_dashboard_token_does_not_stand_in_for_an_owners_sign_in(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDLER_DASHBOARD_TOKEN", "a-long-dashboard-token")

    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            assert (await http.get("/connectors/echo")).status_code == 401
            opened = await http.get("/connectors/echo?token=a-long-dashboard-token", follow_redirects=True)
            assert opened.status_code == 401  # the token opens no page: a member signs in
            assert "handler dashboard login --member NAME" in text(opened)
            refused = await http.post("/connectors/echo/bindings", data=BINDING)
            assert refused.status_code == 403
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/connectors/echo"))
            done = await http.post("/connectors/echo/bindings", data={**BINDING, "csrf": token})
            assert done.status_code == 200
            assert "Wrote config/bindings/echo-new.toml" in text(done)
    asyncio.run(scenario())
    assert (tree / "config/bindings/echo-new.toml").read_text() == (
        'apiVersion = "handler.binding/v1"\nname = "echo-new"\nconnector = "echo"\ndescription = "a second echo"\n'
        'secrets = { token = { env = "ECHO_NEW_TOKEN" } }\nsettings = { greeting = "salut" }\n')


def test_in_git_mode_a_change_is_a_new_branch_pushed_and_the_followed_ref_stays(
        base: Path, tree: Path, git: Git, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tree / "config/profiles/tester.toml"
    profile.write_text("# the tester\n" + profile.read_text())
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "the echo tree")
    upstream = base / "upstream.git"
    git(base, "clone", "-q", "--bare", str(tree), str(upstream))
    main_before = git(upstream, "rev-parse", "main")
    mirror = base / "state/mirror.git"

    async def scenario() -> str:
        async with running(options(base, upstream, source="git", ref="main")) as service, \
                httpx.AsyncClient(base_url=url(service)) as http:
            generation = service.generation
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/profiles/tester"))
            refused = await http.post("/profiles/tester", data={"use.echo": "echo-gone", "was.echo": "echo-local",
                                                                "csrf": token})
            assert refused.status_code == 422
            assert "Not committed" in text(refused)
            assert git(upstream, "branch", "--list", "handler/*") == ""
            assert git(mirror, "branch", "--list", "handler/*") == ""
            done = await http.post("/profiles/tester", data={"use.echo": "echo-other", "was.echo": "echo-local",
                                                             "csrf": token})
            assert done.status_code == 200, text(done)
            branch = re.search(r"new branch (handler/profile-tester-\d{8}-\d{6})", text(done))
            assert branch, text(done)
            assert "pushed it to" in text(done)
            assert service.generation == generation  # nothing applies until the branch is merged
            assert git(mirror, "rev-parse", "main") == main_before
            return branch.group(1)

    branch = asyncio.run(scenario())
    assert git(upstream, "rev-parse", "main") == main_before
    assert git(upstream, "rev-parse", f"{branch}~1") == main_before
    assert git(upstream, "show", f"{branch}:config/profiles/tester.toml") == (
        profile.read_text().replace('echo = "echo-local"', 'echo = "echo-other"').strip())
    assert git(upstream, "log", "-1", "--format=%an <%ae>|%s", branch) == (
        "owner <owner@example.org>|Profile tester: echo → echo-other")


def test_a_key_typed_where_a_reference_goes_is_refused_and_a_loose_reference_is_warned_of(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-proj-Xa1b2C3d4E5f6G7h8J9k0"
    monkeypatch.delenv("ECHO_NEW_TOKEN", raising=False)
    loose = tree / "token.txt"
    loose.write_text("a token\n")
    loose.chmod(0o644)

    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/connectors/echo"))
            for kind in ("file", "env"):
                pasted = await http.post("/connectors/echo/bindings", data={
                    **BINDING, "csrf": token, "secret.token.kind": kind, "secret.token.name": key})
                assert pasted.status_code == 400, pasted.text
                assert "a secret is given by reference, never by value" in text(pasted)
                assert key not in pasted.text  # never shown back
                assert "sk-proj" not in pasted.text
            assert "has the shape of a key or token" in text(pasted := await http.post(  # a name's own characters
                "/connectors/echo/bindings", data={**BINDING, "csrf": token, "secret.token.kind": "env",
                                                   "secret.token.name": "a8Fj29Dkq0Lm3Nx7Pq1Rs5Tu"}))
            assert "a8Fj29" not in pasted.text
            checked = await http.post("/connectors/echo/bindings", data={
                **BINDING, "csrf": token, "action": "check", "secret.token.kind": "file",
                "secret.token.name": "token.txt"})
            assert checked.status_code == 200, checked.text
            assert f"{loose} is readable by every user of this machine" in text(checked)
            unset = await http.post("/connectors/echo/bindings", data={**BINDING, "csrf": token, "action": "check"})
            assert "the running service's environment has no ECHO_NEW_TOKEN" in text(unset)
    asyncio.run(scenario())
    assert not (tree / "config/bindings/echo-new.toml").exists()


def test_in_git_mode_the_changes_page_lists_open_proposals_with_diff_and_plan_and_warns_of_a_shared_file(
        base: Path, tree: Path, git: Git, capsys: pytest.CaptureFixture[str]) -> None:
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "the echo tree")
    upstream = base / "upstream.git"
    git(base, "clone", "-q", "--bare", str(tree), str(upstream))

    async def scenario() -> None:
        async with running(options(base, upstream, source="git", ref="main")) as service, \
                httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/profiles/tester"))
            done = await http.post("/profiles/tester", data={"use.echo": "echo-other", "was.echo": "echo-local",
                                                             "csrf": token})
            assert done.status_code == 200, text(done)
            # Another owner's proposal on the same profile, pushed meanwhile (as the dashboard pushes its own).
            other = base / "other"
            git(base, "clone", "-q", str(upstream), str(other))
            profile = other / "config/profiles/tester.toml"
            profile.write_text(profile.read_text().replace('scope = "work/tester"', '# scoped\nscope = "work/tester"'))
            git(other, "commit", "-qam", "Profile tester: a comment")
            for remote in (str(upstream), str(base / "state/mirror.git")):
                git(other, "push", "-q", remote, "HEAD:refs/heads/handler/profile-tester-comment")
            page = await http.get("/changes")
            assert page.status_code == 200
            said = text(page)
            assert "Proposed from the dashboard, not merged (2)" in said
            assert said.count("Another open proposal changes config/profiles/tester.toml too") == 2
            assert "echo: echo-local (echo/v1" in said  # the plan of each
            assert '-services = { echo = "echo-local" }' in html.unescape(page.text)  # and its diff
            assert "the echo tree" in said  # the followed branch's history: its commit, by its author
            # Merged upstream (main moved onto it), and in the mirror as its next fetch brings it (a fetch may come
            # first: it brings the same), a proposal is no longer open.
            mirror = base / "state/mirror.git"
            merged = git(mirror, "rev-parse", "handler/profile-tester-comment")
            for repository in (upstream, mirror):
                git(repository, "update-ref", "refs/heads/main", merged)
            after = text(await http.get("/changes"))
            assert "not merged (1)" in after, after[after.find("Proposed"):][:1500]
            assert "Another open proposal" not in after

    asyncio.run(scenario())


def confirmation(page: httpx.Response) -> tuple[str, dict[str, str]]:
    """Where a checked change's confirm button posts, and the fields it sends (the form's own, and the csrf)."""
    found = re.search(r'<form class="edit confirm" id="confirm" method="post" action="([^"]+)">(.*?)</form>',
                      page.text, re.S)
    assert found, text(page)
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', found.group(2)))
    return found.group(1), {k: html.unescape(v) for k, v in fields.items()}


def test_a_member_who_is_no_owner_sees_the_rules_but_no_governance_form_and_every_post_is_refused(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    posts = {"/profiles/tester/rules": {"target": "action:echo_say", "outcome": "block"},
             "/profiles/tester/pins": {"interface": "echo", "pin": "set"},
             "/profiles/tester/routing": {"to": "none"},
             "/profiles/tester/caps": {"scope": "profile", "amount": "5"},
             "/profiles": {"name": "reviewer", "template": "restrictive"}}
    before = (tree / "config/profiles/tester.toml").read_text()

    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            for path, data in posts.items():  # nobody signed in
                refused = await http.post(path, data={**data, "action": "apply"})
                assert refused.status_code == 403, path
                assert "editing the config needs an owner's sign-in" in text(refused)
            link = login_link(capsys, tree, service, "bob")
            await http.post("/login", data=fields_of(link))
            page = await http.get("/profiles/tester")
            assert page.status_code == 200
            assert "No per-action rule: the permissive template decides" in text(page)
            assert 'id="rule-form"' not in page.text
            assert 'action="/profiles"' not in page.text
            session = http.cookies["handler_member"]
            for path, data in posts.items():  # signed in, with the session's own token, but no owner
                refused = await http.post(path, data={**data, "action": "apply", "csrf": signer(base).csrf(session)})
                assert refused.status_code == 403, path
    asyncio.run(scenario())
    assert (tree / "config/profiles/tester.toml").read_text() == before
    assert not (tree / "config/profiles/reviewer.toml").exists()


def test_an_owner_sees_each_governance_forms_plan_and_decisions_before_confirming_it(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tree / "config/profiles/tester.toml"
    before = profile.read_text()

    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            page = await http.get("/profiles/tester")
            for form in ("rule-form", "pin-form", "routing-form", "cap-form", "create-form"):
                assert f'id="{form}"' in page.text, form
            token = csrf(page)
            checked = await http.post("/profiles/tester/rules", data={
                "csrf": token, "target": "action:echo_say", "outcome": "block", "action": "check"})
            assert checked.status_code == 200, text(checked)
            shown = text(checked)
            assert "The change passes every check. Nothing was written yet" in shown
            assert "echo: echo_say auto → block" in shown  # the plan
            assert "What tester's calls would get, as handler explain says" in shown
            assert "the rule for action echo_say says block" in shown
            explained.append(html.unescape(re.findall(r'<pre class="explain">(.*?)</pre>', checked.text, re.S)[0]))
            assert profile.read_text() == before  # nothing yet
            target, fields = confirmation(checked)
            assert (target, fields) == ("/profiles/tester/rules", {
                "csrf": token, "target": "action:echo_say", "outcome": "block"})
            done = await http.post(target, data={**fields, "action": "apply"})
            assert done.status_code == 200, text(done)
            assert "Wrote config/profiles/tester.toml" in text(done)
            assert 'id="confirm"' not in done.text

    explained: list[str] = []
    asyncio.run(scenario())
    assert profile.read_text() == before + '\n[[rules]]\naction = "echo_say"\noutcome = "block"\n'
    capsys.readouterr()
    assert main(["explain", "--profile", "tester", "--tool", "echo_say", "--root", str(tree)]) == 0
    assert capsys.readouterr().out.strip() == explained[0]  # the page said what `handler explain` now says


async def checked_then_confirmed(http: httpx.AsyncClient, path: str, data: dict[str, str]) -> tuple[str, str]:
    """A governance form sent as its page sends it (the plan asked first), then confirmed: both pages' text."""
    checked = await http.post(path, data={**data, "action": "check"})
    assert checked.status_code == 200, text(checked)
    target, fields = confirmation(checked)
    done = await http.post(target, data={**fields, "action": "apply"})
    assert done.status_code == 200, text(done)
    return text(checked), text(done)


def test_each_governance_form_writes_what_its_cli_command_writes_and_the_tree_validates(
        base: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tree / "config/profiles/tester.toml"
    before = profile.read_text()

    async def scenario() -> None:
        async with running(options(base, tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/profiles/tester"))
            checked, _ = await checked_then_confirmed(http, "/profiles/tester/pins",
                                                      {"csrf": token, "interface": "echo", "pin": "set"})
            assert "echo_say on profile tester" in checked  # a read tool, automatic before, now waits
            assert "pending (decision: approve)" in checked
            checked, _ = await checked_then_confirmed(http, "/profiles/tester/routing",
                                                      {"csrf": token, "to": "member:bob"})
            assert "approver: member bob" in checked
            refused = await http.post("/profiles/tester/routing", data={"csrf": token, "to": "none", "action": "check"})
            assert refused.status_code == 422  # nobody to decide beside a pin: the checks keep it out
            assert "P006" in text(refused)
            assert 'id="confirm"' not in refused.text  # and nothing to confirm
            checked, _ = await checked_then_confirmed(http, "/profiles/tester/caps",
                                                      {"csrf": token, "scope": "instance", "amount": "2.5"})
            assert "No call of tester is decided otherwise" in checked  # a cap's effect is in the plan
            await checked_then_confirmed(http, "/profiles/tester/caps", {"csrf": token, "scope": "org", "amount": "40"})
            checked, done = await checked_then_confirmed(http, "/profiles", {
                "csrf": token, "name": "reviewer", "template": "restrictive", "from": "tester", "copy": "1"})
            assert "profile reviewer (added)" in checked
            assert "What reviewer's calls would get" in checked
            assert "echo_write on profile reviewer" in checked
            assert "Wrote config/profiles/reviewer.toml , work/reviewer/.gitkeep" in done
            bad = await http.post("/profiles/tester/caps", data={"csrf": token, "scope": "profile", "amount": "ten"})
            assert bad.status_code == 400
            assert "a cap is an amount in USD, e.g. 25 or 12.50, not 'ten'" in text(bad)
            bad = await http.post("/profiles/tester/routing", data={"csrf": token, "to": "bob"})
            assert bad.status_code == 400
            assert "give member:NAME, slack:#CHANNEL, caller, none, or default" in text(bad)
            bad = await http.post("/profiles", data={"csrf": token, "name": "tester", "template": "balanced"})
            assert bad.status_code == 400
            assert "profile tester exists" in text(bad)
    asyncio.run(scenario())
    assert profile.read_text() == before + (
        'pins = ["echo"]\nrouting = {to = "member", member = "bob"}\n\n[caps]\ninstance_usd = 2.5\n')
    assert "[caps]\nmonthly_usd = 40.0\n" in (tree / "config/org.toml").read_text()
    made = (tree / "config/profiles/reviewer.toml").read_text()
    assert 'template = "restrictive"' in made
    assert 'services = { echo = "echo-local" }' in made
    capsys.readouterr()
    assert main(["validate", "--root", str(tree)]) == 0, capsys.readouterr().out


def test_in_git_mode_an_owner_makes_a_restrictive_profile_and_a_rule_each_on_a_new_branch(
        base: Path, tree: Path, git: Git, capsys: pytest.CaptureFixture[str]) -> None:
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "the echo tree")
    upstream = base / "upstream.git"
    git(base, "clone", "-q", "--bare", str(tree), str(upstream))
    main_before = git(upstream, "rev-parse", "main")

    async def scenario() -> list[str]:
        async with running(options(base, upstream, source="git", ref="main")) as service, \
                httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, login_link(capsys, tree, service))
            token = csrf(await http.get("/profiles/tester"))
            _, made = await checked_then_confirmed(http, "/profiles", {
                "csrf": token, "name": "reviewer", "template": "restrictive", "from": "tester", "copy": "1"})
            _, ruled = await checked_then_confirmed(http, "/profiles/tester/rules", {
                "csrf": token, "target": "action:echo_write", "outcome": "block"})
            return [re.search(r"new branch (handler/\S+)", t).group(1) for t in (made, ruled)]  # type: ignore[union-attr]

    made, ruled = asyncio.run(scenario())
    assert made.startswith("handler/profile-reviewer-")
    assert ruled.startswith("handler/profile-tester-rule-")
    assert git(upstream, "rev-parse", "main") == main_before  # the followed ref never moves
    assert git(upstream, "diff", "--name-only", "main", made).splitlines() == [
        "config/profiles/reviewer.toml", "work/reviewer/.gitkeep"]
    assert 'template = "restrictive"' in git(upstream, "show", f"{made}:config/profiles/reviewer.toml")
    assert git(upstream, "show", f"{ruled}:config/profiles/tester.toml").endswith(
        '[[rules]]\naction = "echo_write"\noutcome = "block"')
    assert git(upstream, "log", "-1", "--format=%an|%s", ruled) == "owner|Profile tester: action echo_write → block"
