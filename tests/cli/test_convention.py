"""One CLI convention: the config root by --root (or HANDLER_ROOT, else the current folder, with the positional
ROOT kept where it was), help on every option, no store made in a folder that is not a config root, revisions
shortened one way, and `handler plan` from HEAD by default with its values written as TOML."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.cli import _build_parser
from reconciler.config import short_revision

HANDLER = str(Path(sys.executable).with_name("handler"))
REPO = Path(__file__).resolve().parents[2]


def _handler(*args: str, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HANDLER_")}
    return subprocess.run([HANDLER, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
                          env={**clean, **(env or {})})


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command's parser, with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


def test_every_option_of_every_command_says_what_it_does() -> None:
    silent = [(" ".join(path), action.dest) for path, parser in _commands(_build_parser())
              for action in parser._actions
              if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction) and not action.help]
    assert silent == []


def test_every_command_that_reads_a_tree_takes_root_and_handler_root() -> None:
    parser = _build_parser()
    takes_root = {" ".join(path) for path, p in _commands(parser)
                  if any(a.dest == "root_option" for a in p._actions)}
    assert takes_root >= {"validate", "plan", "mcp-config", "explain", "doctor", "serve", "up", "status",
                          "approvals list", "approvals show", "approvals approve", "approvals reject", "audit",
                          "spend", "balance show", "balance add", "store migrate", "binding create", "profile use"}


def test_root_comes_from_the_option_the_positional_alias_or_handler_root(tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(REPO / "config", root / "config")
    shutil.copytree(REPO / "catalog/interfaces", root / "catalog/interfaces")
    shutil.copytree(REPO / "catalog/connectors", root / "catalog/connectors")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for way in (("--root", str(root)), (str(root),)):
        done = _handler("validate", *way, cwd=elsewhere)
        assert done.returncode == 0, done.stdout + done.stderr
    done = _handler("validate", cwd=elsewhere, env={"HANDLER_ROOT": str(root)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert _handler("validate", cwd=root).returncode == 0  # the current folder
    done = _handler("validate", str(root), "--root", str(elsewhere))
    assert done.returncode == 2
    assert "two config roots given" in done.stderr


@pytest.mark.parametrize("command", [("approvals", "list"), ("approvals", "show", "r-1"), ("audit",), ("spend",),
                                     ("balance", "show"), ("store", "migrate"),
                                     ("explain", "--profile", "p", "--tool", "t")])
def test_a_command_of_the_store_refuses_a_folder_that_is_not_a_config_root(tmp_path: Path,
                                                                          command: tuple[str, ...]) -> None:
    done = _handler(*command, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the current folder holds neither config/ nor catalog/" in done.stderr
    assert "--root DIR (or HANDLER_ROOT)" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no .handler/handler.db made here


def test_revisions_are_shortened_one_way() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert short_revision(commit) == "0123456789ab"
    assert short_revision("tree:0123456789ab") == "tree:0123456789ab"
    assert short_revision("(unreadable)") == "(unreadable)"


def test_plan_starts_from_head_and_writes_values_as_toml(shipped_tree: Path, git: Callable[..., str]) -> None:
    done = _handler("plan", "--root", str(shipped_tree))
    assert done.stdout.startswith("Plan (empty tree) → tree:"), done.stdout  # not in git: from nothing
    git(shipped_tree, "init", "-q")
    git(shipped_tree, "add", "-A")
    git(shipped_tree, "commit", "-q", "-m", "tree")
    head = git(shipped_tree, "rev-parse", "HEAD")
    done = _handler("plan", "--root", str(shipped_tree))
    assert done.stdout.startswith(f"No changes ({head[:12]} → tree:"), done.stdout
    profile = shipped_tree / "config/profiles/assistant.toml"
    profile.write_text(profile.read_text().replace("monthly_usd = 100.0", "monthly_usd = 150.0")
                       .replace('pins = ["send-email"]', "pins = []"))
    done = _handler("plan", "--root", str(shipped_tree))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Plan {head[:12]} → tree:")
    assert ("    caps: { monthly_usd = 100.0, instance_usd = 2.0 } → { monthly_usd = 150.0, instance_usd = 2.0 }"
            in done.stdout.splitlines())
    assert '    pins: ["send-email"] → []' in done.stdout.splitlines()
    assert '    routing: { to = "slack", channel = "#approvals" }' not in done.stdout  # unchanged: not shown
