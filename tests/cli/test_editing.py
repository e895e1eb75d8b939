"""`handler binding create` and `handler profile use` on a copy of the example tree in a git repository:
TOML written with comments and key order kept, checked before anything is written, and with `--branch`
committed to a new branch while the work tree, HEAD and the followed ref stay as they were."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HANDLER = str(Path(sys.executable).with_name("handler"))
REPO = Path(__file__).resolve().parents[2]
Git = Callable[..., str]


def _handler(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HANDLER_")}
    identity = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.org",
                "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.org"}
    return subprocess.run([HANDLER, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
                          env={**clean, **identity})


@pytest.fixture
def example(tmp_path: Path, git: Git) -> Path:
    """The example tree (catalog/ and config/) at `ops/` in a git repository with one commit on main."""
    root = tmp_path / "repo" / "ops"
    for part in ("catalog", "config"):
        shutil.copytree(REPO / part, root / part)
    git(root.parent, "init", "-q")
    git(root.parent, "add", "-A")
    git(root.parent, "commit", "-q", "-m", "the example tree")
    return root


def test_binding_create_writes_a_checked_binding_and_prints_the_plan(example: Path) -> None:
    done = _handler("binding", "create", "brave-fr", "--connector", "web-search-brave", "--description",
                    "Brave, French results", "--secret", "api_key=env:BRAVE_FR_KEY", "--setting", "country=FR",
                    "--root", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (example / "config/bindings/brave-fr.toml").read_text() == (
        'apiVersion = "handler.binding/v1"\n'
        'name = "brave-fr"\n'
        'connector = "web-search-brave"\n'
        'description = "Brave, French results"\n'
        'secrets = { api_key = { env = "BRAVE_FR_KEY" } }\n'
        'settings = { country = "FR" }\n'
    )
    assert "No changes" in done.stdout  # no profile uses it yet
    assert "wrote config/bindings/brave-fr.toml" in done.stdout
    # A command reference keeps its words apart, as the shell split them.
    done = _handler("binding", "create", "brave-pass", "--connector", "web-search-brave", "--secret",
                    "api_key=command:pass show 'brave/api key'", cwd=example)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'secrets = { api_key = { command = ["pass", "show", "brave/api key"] } }' in (
        example / "config/bindings/brave-pass.toml").read_text()
    assert _handler("validate", "--root", str(example)).returncode == 0


def test_profile_use_keeps_comments_key_order_and_the_pinned_version(example: Path) -> None:
    path = example / "config/profiles/auditor.toml"
    before = path.read_text()
    done = _handler("profile", "use", "auditor", "ocr=ocr-mistral-perso", "--root", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    # One value changed; every comment, key and table where it was, the pinned "ocr/v1" key kept.
    assert path.read_text() == before.replace('"ocr/v1" = "ocr-local"', '"ocr/v1" = "ocr-mistral-perso"')
    assert "profile auditor (changed)" in done.stdout
    assert "ocr: ocr-local (ocr/v1; ocr_extract auto) → ocr-mistral-perso (ocr/v1; ocr_extract auto)" in done.stdout

    path = example / "config/profiles/assistant.toml"
    before = path.read_text()
    assert _handler("profile", "use", "assistant", "llm=llm-anthropic", cwd=example).returncode == 0
    # A new interface goes at the end of services; the comments above and below stay.
    assert path.read_text() == before.replace('web-search = "search-brave" }',
                                              'web-search = "search-brave", llm = "llm-anthropic" }')


def test_profile_use_edits_dotted_services_keys_in_place(example: Path) -> None:
    path = example / "config/profiles/researcher.toml"
    text = path.read_text()
    line = next(line for line in text.splitlines() if line.startswith("services = "))
    dotted = ('services.ocr = "ocr-local"  # scans stay here\n'
              'services.web-search = "search-brave"  # the team\'s key\n')
    path.write_text(before := text.replace(line + "\n", dotted))
    done = _handler("profile", "use", "researcher", "ocr/v1=ocr-mistral-perso", "web-search=search-searxng",
                    "--root", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    # The pin replaces the key where it stood; both comments stay; no inline table in their place.
    assert path.read_text() == before.replace('services.ocr = "ocr-local"', 'services."ocr/v1" = "ocr-mistral-perso"'
                                              ).replace('"search-brave"', '"search-searxng"')


def test_a_change_with_findings_is_refused_and_nothing_is_written(example: Path) -> None:
    profile = example / "config/profiles/researcher.toml"
    before = profile.read_text()
    done = _handler("profile", "use", "researcher", "ocr=ocr-locl", "--root", str(example))
    assert done.returncode == 1
    services = 1 + before.splitlines().index(next(line for line in before.splitlines() if line.startswith("services")))
    assert f"config/profiles/researcher.toml:{services}: P001" in done.stdout  # at the line it would change
    assert "ocr-locl" in done.stdout
    assert "fix:" in done.stdout  # the finding with its fix line
    assert "not written" in done.stdout
    assert profile.read_text() == before

    done = _handler("binding", "create", "brave2", "--connector", "web-search-brave", "--root", str(example))
    assert done.returncode == 1
    assert "B002" in done.stdout
    assert "fix: secrets = { api_key = { env = \"BRAVE_API_KEY\" } }" in done.stdout
    assert not (example / "config/bindings/brave2.toml").exists()


def test_a_secret_value_and_an_existing_binding_are_refused(example: Path) -> None:
    done = _handler("binding", "create", "leak", "--connector", "web-search-brave", "--secret", "api_key=sk-123",
                    "--root", str(example))
    assert done.returncode == 2
    assert "by reference, never by value" in done.stderr
    assert "sk-123" not in done.stdout + done.stderr
    assert not (example / "config/bindings/leak.toml").exists()
    # A reference that could never name a secret is refused as a usage error, in one line.
    for secret in ('api_key=command:""', "api_key=env:A B", "api_key=file:sk-proj-Xa1b2C3d4E5f6G7h8J9k0"):
        done = _handler("binding", "create", "never", "--connector", "web-search-brave", "--secret", secret,
                        "--root", str(example))
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("handler: secret api_key: "), done.stderr
        assert not (example / "config/bindings/never.toml").exists()
        assert "Xa1b2C3d4" not in done.stderr  # a key pasted in the file's place is never repeated
    done = _handler("binding", "create", "ocr-local", "--connector", "ocr-tesseract", "--root", str(example))
    assert done.returncode == 2
    assert "binding ocr-local exists" in done.stderr


def test_a_file_reference_missing_here_or_readable_by_all_is_warned_of_and_written(example: Path) -> None:
    (example / "brave.key").write_text("a key\n")
    (example / "brave.key").chmod(0o644)
    for name, target, said in (("brave-a", "nowhere.key", f"there is no file {example / 'nowhere.key'}"),
                               ("brave-b", "brave.key", f"{example / 'brave.key'} is readable by every user")):
        done = _handler("binding", "create", name, "--connector", "web-search-brave", "--secret",
                        f"api_key=file:{target}", "--root", str(example))
        assert done.returncode == 0, done.stderr
        assert f"warning: secret api_key: {said}" in done.stderr
        assert (example / f"config/bindings/{name}.toml").exists()  # a warning: the file may come later


def test_a_profile_behind_a_symbolic_link_is_refused_as_the_loader_refuses_it(example: Path, tmp_path: Path) -> None:
    """The tree never follows a link (F006): an edit says so, for the file or a folder of it, and writes nothing."""
    profile = example / "config/profiles/researcher.toml"
    outside = tmp_path / "researcher.toml"
    outside.write_text(text := profile.read_text())
    profile.unlink()
    profile.symlink_to(outside)
    done = _handler("profile", "use", "researcher", "ocr=ocr-mistral-perso", "--root", str(example))
    assert done.returncode == 2
    assert done.stderr == (f"handler: config/profiles/researcher.toml is a symbolic link (to {outside}), and links "
                           "in a config tree are not followed (F006); replace it with a copy of what it points to\n")
    assert profile.is_symlink()
    assert outside.read_text() == text

    folder = example / "config/profiles"
    folder.rename(tmp_path / "profiles")
    folder.symlink_to(tmp_path / "profiles")
    done = _handler("profile", "use", "auditor", "ocr=ocr-mistral-perso", "--root", str(example))
    assert done.returncode == 2
    assert done.stderr.startswith("handler: config/profiles is a symbolic link"), done.stderr


@pytest.mark.parametrize(("words", "said"), [
    (["binding", "create", "brave-2", "--connector", "web-search-brave", "--secret", "api_key=env:A",
      "--secret", "api_key=env:B"], "handler: --secret api_key is given twice; give each slot once"),
    (["binding", "create", "brave-2", "--connector", "web-search-brave", "--secret", "api_key=env:A",
      "--setting", "country=FR", "--setting", "country=US"],
     "handler: --setting country is given twice; give each setting once"),
    (["profile", "use", "researcher", "ocr=ocr-local", "ocr/v1=ocr-mistral-perso"],
     "handler: interface ocr is given twice; give each interface once"),
])
def test_one_key_given_twice_is_a_usage_error_and_nothing_is_written(example: Path, git: Git, words: list[str],
                                                                      said: str) -> None:
    # The last one was kept without a word: --setting country=FR --setting country=US wrote country = "US".
    done = _handler(*words, "--root", str(example))
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (2, "", [said])
    assert git(example.parent, "status", "--porcelain") == ""


def test_branch_commits_the_change_and_leaves_work_tree_head_and_main_alone(example: Path, git: Git) -> None:
    repo = example.parent
    git(repo, "remote", "add", "origin", str(repo.parent / "upstream.git"))
    main_before = git(repo, "rev-parse", "main")
    done = _handler("profile", "use", "researcher", "ocr=ocr-mistral-perso", "--branch", "use-mistral",
                    "--root", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "committed" in done.stdout
    assert "new branch use-mistral" in done.stdout
    assert "push it for a pull request: git push -u origin use-mistral" in done.stdout
    assert git(repo, "rev-parse", "main") == main_before
    assert git(repo, "rev-parse", "HEAD") == main_before
    assert git(repo, "status", "--porcelain") == ""  # work tree and index untouched
    assert git(repo, "rev-parse", "use-mistral~1") == main_before
    assert git(repo, "diff", "--name-only", "main", "use-mistral") == "ops/config/profiles/researcher.toml"
    assert 'ocr = "ocr-mistral-perso"' in git(repo, "show", "use-mistral:ops/config/profiles/researcher.toml")
    assert git(repo, "log", "-1", "--format=%s", "use-mistral") == "Profile researcher: ocr → ocr-mistral-perso"

    # An existing branch is never moved, the followed one least of all.
    for branch in ("use-mistral", "main"):
        tip = git(repo, "rev-parse", branch)
        again = _handler("binding", "create", "brave2", "--connector", "web-search-brave", "--secret",
                         "api_key=env:K", "--branch", branch, "--root", str(example))
        assert again.returncode == 2
        assert f"branch {branch} exists" in again.stderr
        assert git(repo, "rev-parse", branch) == tip


def test_branch_is_checked_against_the_commit_it_starts_from(example: Path, git: Git) -> None:
    # A binding written (not committed) in the work tree is not on HEAD: the branch cannot use it.
    assert _handler("binding", "create", "brave2", "--connector", "web-search-brave", "--secret", "api_key=env:K",
                    "--root", str(example)).returncode == 0
    done = _handler("profile", "use", "researcher", "web-search=brave2", "--branch", "use-brave2",
                    "--root", str(example))
    assert done.returncode == 1
    assert "P001" in done.stdout
    assert git(example.parent, "branch", "--list", "use-brave2") == ""


def _plan_body(text: str) -> list[str]:
    """A plan's lines after its header (the header names the two revisions, which differ by how they were read)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Plan ")), None)
    assert start is not None, text
    body = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        body.append(line)
    return body


@pytest.mark.parametrize(("words", "profile", "tool", "decided"), [
    (["rule", "set", "assistant", "send_email_send", "block"], "assistant", "send_email_send", "blocked"),
    (["rule", "set", "auditor", "web-search", "block", "--service"], "auditor", "web_search_query", "blocked"),
    (["pin", "set", "researcher", "ocr"], "researcher", "ocr_extract", "pending"),
    (["pin", "unset", "assistant", "send-email"], "assistant", "send_email_send", "pending"),
    (["routing", "set", "assistant", "caller"], "assistant", "send_email_send", "pending"),
    (["profile", "create", "scribe", "--template", "restrictive", "--from", "assistant"], "scribe", "send_email_send",
     "blocked"),
])
def test_a_governance_command_writes_a_valid_file_prints_the_plan_and_explain_agrees(
        example: Path, words: list[str], profile: str, tool: str, decided: str) -> None:
    done = _handler(*words, "--root", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stdout  # a new profile's work folder is written beside the tree, not read as config
    assert _handler("validate", "--root", str(example)).returncode == 0
    plan = _handler("plan", "--base", "HEAD", "--root", str(example))
    assert _plan_body(done.stdout) == _plan_body(plan.stdout), (done.stdout, plan.stdout)
    explained = _handler("explain", "--profile", profile, "--tool", tool, "--root", str(example))
    assert explained.returncode == 0, explained.stderr
    verdict = explained.stdout.splitlines()[0]  # at the tool's price, as a call would be
    assert re.fullmatch(rf"{tool} on profile {profile} at \$[0-9.]+: {decided} \(decision: \w+\)", verdict), verdict
    said = [line for line in done.stdout.splitlines() if line.startswith(f"{tool} on profile {profile} at")]
    assert [line.split(": ", 1)[1] for line in said] in ([], [verdict.split(": ", 1)[1]])  # the same decision
    if words[:2] == ["profile", "create"]:
        assert said, done.stdout  # a new profile's every call is one its creation decides


def test_a_cap_and_a_rule_unset_are_written_where_they_belong_with_comments_kept(example: Path) -> None:
    profile = example / "config/profiles/researcher.toml"
    profile.write_text(profile.read_text().replace("[caps]", "# what it may spend\n[caps]"))
    for words in (["cap", "set", "researcher", "50", "--per-instance"], ["cap", "set", "org", "900"],
                  ["rule", "set", "researcher", "ocr_extract", "approve"],
                  ["rule", "unset", "researcher", "ocr_extract"]):
        done = _handler(*words, "--root", str(example))
        assert done.returncode == 0, done.stdout + done.stderr
    text = profile.read_text()
    assert "# what it may spend\n[caps]\nmonthly_usd = 200.0\ninstance_usd = 50.0\n" in text
    assert "rules" not in text  # set, then unset: nothing left
    assert "[caps]\nmonthly_usd = 900.0" in (example / "config/org.toml").read_text()
    again = _handler("rule", "set", "auditor", "web-search", "approve", "--service", "--root", str(example))
    assert again.returncode == 2
    assert "has that rule already (service web-search: approve); nothing to change" in again.stderr
    missing = _handler("rule", "unset", "researcher", "ocr_extract", "--root", str(example))
    assert missing.returncode == 2
    assert "has no rule on action ocr_extract (its rules: none)" in missing.stderr
    refused = _handler("routing", "set", "assistant", "member:nobody", "--root", str(example))
    assert refused.returncode == 1  # the checks refuse a member the org lacks; nothing is written
    assert "nobody" in refused.stdout
    assert 'to = "member"' not in (example / "config/profiles/assistant.toml").read_text()


def test_a_profile_made_on_a_branch_leaves_the_work_tree_alone(example: Path, git: Git) -> None:
    done = _handler("profile", "create", "scribe", "--template", "restrictive", "--branch", "add-scribe",
                    "--root", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "committed" in done.stdout
    assert not (example / "config/profiles/scribe.toml").exists()
    shown = git(example.parent, "show", "add-scribe:ops/config/profiles/scribe.toml")
    assert 'template = "restrictive"' in shown
    assert 'scope = "work/scribe"' in shown
