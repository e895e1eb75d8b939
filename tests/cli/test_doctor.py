"""`handler doctor` on the example tree: each missing credential, each unconfigured channel, each missing scope,
with how to fix it; and nothing once the machine has what the tree asks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree

HANDLER = str(Path(sys.executable).with_name("handler"))
REPO = Path(__file__).resolve().parents[2]


def _example(tmp_path: Path) -> Path:
    root = tmp_path / "example"
    for part in ("catalog", "config"):
        shutil.copytree(REPO / part, root / part)
    return root


def _doctor(root: Path, env: dict[str, str], *more: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HANDLER_", "OPENAI_", "BRAVE_"))}
    return subprocess.run([HANDLER, "doctor", str(root), *more], capture_output=True, text=True, timeout=120,
                          check=False, env={**clean, **env})


def test_doctor_lists_each_missing_credential_channel_and_scope(tmp_path: Path) -> None:
    root = _example(tmp_path)
    done = _doctor(root, {})
    assert done.returncode == 1
    out = done.stdout
    assert "error: binding llm-openai: secret slot 'api_key': the router's environment has no OPENAI_API_KEY" in out
    assert "fix: export OPENAI_API_KEY=... in the service's environment before it starts" in out
    assert "error: binding search-brave: secret slot 'api_key': the router's environment has no BRAVE_API_KEY" in out
    assert "error: binding email-smtp: secret slot 'password': cannot run pass" in out
    assert "warning: profile assistant: holds are routed to Slack #approvals, but no Slack token is set" in out
    assert "fix: set HANDLER_SLACK_TOKEN" in out
    assert "warning: profile auditor: holds are routed to alice, but no mail server is set" in out
    assert "error: profile researcher: its scope work/researcher does not exist" in out
    assert out.startswith("judged in this shell's environment\n")  # no service runs on the tree
    judged = json.loads(_doctor(root, {}, "--format", "json").stdout)
    assert judged["judged"] == "this shell's environment"
    subjects = {p["subject"] for p in judged["problems"]}
    assert subjects >= {"binding llm-openai", "binding search-brave", "profile assistant"}


def test_what_the_machine_provides_leaves_the_list(tmp_path: Path) -> None:
    root = _example(tmp_path)
    for profile in ("assistant", "auditor", "researcher"):
        (root / "work" / profile).mkdir(parents=True)
    env = {"OPENAI_API_KEY": "k", "BRAVE_API_KEY": "k", "HANDLER_SLACK_TOKEN": "xoxb-t",
           "HANDLER_SMTP_URL": "smtp://127.0.0.1:2525"}
    out = _doctor(root, env).stdout
    assert "OPENAI_API_KEY" not in out
    assert "BRAVE_API_KEY" not in out
    assert "Slack" not in out
    assert "mail server" not in out
    assert "scope" not in out
    assert "cannot run pass" in out  # the password manager is still not on this machine


def test_a_tree_this_machine_serves_whole_is_ok(tmp_path: Path) -> None:
    root = write_echo_tree(tmp_path / "t")
    done = _doctor(root, {TOKEN_ENV: "t"})
    assert done.returncode == 0, done.stdout
    assert done.stdout == f"judged in this shell's environment\nOK: nothing on this machine keeps {root} from working\n"


def test_a_profile_whose_socket_would_not_fit_the_run_folder_is_named(tmp_path: Path) -> None:
    """Valid as data (a name of 95 characters), but its socket under this run folder is past what a unix socket's
    path holds: `handler up` could not serve it, and doctor says so before."""
    root = write_echo_tree(tmp_path / "t")
    name = "p" * 95
    tester = (root / "config/profiles/tester.toml").read_text()
    (root / f"config/profiles/{name}.toml").write_text(tester.replace('"tester"', f'"{name}"'))
    run_dir = tmp_path / "run"
    done = _doctor(root, {TOKEN_ENV: "t", "HANDLER_RUN_DIR": str(run_dir)})
    assert done.returncode == 1, done.stdout
    assert f"error: profile {name}: its socket {run_dir}/profiles/{name}.sock is " in done.stdout
    assert "past the 107 a unix socket's path holds" in done.stdout
    assert "fix: give the profile a shorter name, or set HANDLER_RUN_DIR to a shorter folder" in done.stdout
    assert "profile tester" not in done.stdout  # its socket fits


def test_a_file_where_the_run_or_state_folder_goes_is_an_error(tmp_path: Path) -> None:
    # doctor said OK for it, and the service then failed to start on a traceback.
    root = write_echo_tree(tmp_path / "t")
    (root / "work").mkdir(exist_ok=True)
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    done = _doctor(root, {TOKEN_ENV: "t", "HANDLER_RUN_DIR": str(file), "HANDLER_STATE_DIR": f"{file}/state"},
                   "--no-sandbox")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "judged in this shell's environment",  # no service can run on a state folder that is a file
        f"error: run folder: {file} is not a folder: the service cannot start",
        "  fix: point HANDLER_RUN_DIR (or --run-dir) at a folder, or move what is there away",
        f"error: state folder: {file}/state cannot be a folder: {file} is not one: the service cannot start",
        "  fix: point HANDLER_STATE_DIR (or --state-dir) at a folder, or move what is there away",
        "2 errors, 0 warnings"]
    assert file.read_text() == "kept\n"
