"""`handler call` as a script runs it: a real `handler serve` on the shipped tree (plus the echo
interface), and the real `handler` command talking to its sockets; one test per exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.cli.call import render_text
from reconciler.cli.flags import kebab, plan_flags
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import short_dir

REPO = Path(__file__).resolve().parents[2]
HANDLER = str(Path(sys.executable).with_name("handler"))
DEADLINE = 30.0
HAS_OCR = bool(shutil.which("tesseract") and shutil.which("pdftoppm"))

_TESTER = """apiVersion = "handler.profile/v1"
name = "tester"
description = "Calls the echo from scripts"
scope = "work/tester"
template = "permissive"
services = { echo = "echo-local" }

[[rules]]
action = "echo_write"
outcome = "approve"

[[rules]]
action = "echo_token"
outcome = "block"
"""


@dataclass(frozen=True)
class Served:
    root: Path
    run_dir: Path

    def call(self, *words: str, env: dict[str, str] | None = None, stdin: str | None = None,
             ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([HANDLER, "call", *words], capture_output=True, text=True, timeout=60, check=False,
                              input=stdin, env={**os.environ, "HANDLER_RUN_DIR": str(self.run_dir), **(env or {})})


def _tree(root: Path) -> Path:
    """The shipped catalog and config, the invoice in the researcher's work folder, and the echo for `tester`."""
    for part in ("catalog/interfaces", "catalog/connectors", "config"):
        shutil.copytree(REPO / part, root / part)
    echo = write_echo_tree(root.parent / "echo")
    for part in ("catalog/interfaces/echo", "catalog/connectors/echo"):
        shutil.copytree(echo / part, root / part)
    shutil.copy(echo / "config/bindings/echo-local.toml", root / "config/bindings/echo-local.toml")
    (root / "config/profiles/tester.toml").write_text(_TESTER)
    (root / "work/tester").mkdir(parents=True)
    (root / "work/researcher").mkdir(parents=True)
    shutil.copy(REPO / "catalog/interfaces/ocr/v1/conformance/invoice.pdf", root / "work/researcher/invoice.pdf")
    return root


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """`handler serve` on the tree, until the module's tests are done."""
    with short_dir() as folder:
        root, run_dir = _tree(folder / "t"), folder / "r"
        env = {**os.environ, TOKEN_ENV: "tok", "HANDLER_RUN_DIR": str(run_dir)}
        drain: threading.Thread | None = None
        proc = subprocess.Popen([HANDLER, "serve", str(root)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # the service prints its sockets once it serves
            assert "tester" in line, line + proc.stdout.read()
            drain = threading.Thread(target=proc.stdout.read, daemon=True)  # later lines must not fill the pipe
            drain.start()
            yield Served(root, run_dir)
        finally:
            proc.terminate()
            proc.wait(DEADLINE)
            if drain is not None:
                drain.join(DEADLINE)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.mark.skipif(not HAS_OCR, reason="tesseract-ocr and poppler-utils are not installed (.ci/run installs them)")
def test_ocr_extract_prints_the_text_of_the_invoice(served: Served) -> None:
    done = served.call("ocr", "ocr_extract", "--profile", "researcher", "--path", "invoice.pdf")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("INV-2024-0042") == 1, done.stdout  # a page's text, not its blocks' again


def test_a_file_not_in_the_work_folder_says_where_the_work_folder_is(served: Served) -> None:
    done = served.call("ocr", "ocr_extract", "--profile", "researcher", "--path", "scan.pdf", "--root",
                       str(served.root))
    assert done.returncode == 2
    assert "there is no file 'scan.pdf'" in done.stderr
    assert f"work folder of profile 'researcher': {served.root / 'work/researcher'}" in done.stderr


def test_text_output_prints_each_text_once_and_names_the_pages() -> None:
    block = {"text": "Total", "bbox": [0, 0, 1, 1]}
    one = {"pages": [{"text": "Invoice\nTotal", "blocks": [block]}]}
    assert render_text(one) == "Invoice\nTotal"
    two = {"pages": [{"text": "first", "blocks": [block]}, {"text": "second"}]}
    assert render_text(two) == "── page 1 of 2 ──\nfirst\n── page 2 of 2 ──\nsecond"
    assert render_text({"results": [{"url": "u"}]}) == '{\n  "results": [\n    {\n      "url": "u"\n    }\n  ]\n}'


def test_exit_0_executed_with_flags_from_the_schema(served: Served) -> None:
    upper = served.call("echo", "echo_say", "--profile", "tester", "--text", "hello", "--upper")
    assert (upper.returncode, upper.stdout) == (0, "HELLO\n"), upper.stderr
    as_json = served.call("echo", "echo_say", "--profile", "tester", "--json", '{"text": "hi"}', "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {"text": "hi"}
    repeated = served.call("echo", "echo_misbehave", "--profile", "tester", "--mode", "probe",
                           "--paths", "a", "--paths", "b", "--format", "json")
    assert repeated.returncode == 0, repeated.stderr


def test_the_calls_carry_the_scripts_instance_into_the_call_log(served: Served) -> None:
    done = served.call("echo", "echo_say", "--profile", "tester", "--text", "logged",
                       env={"HANDLER_INSTANCE": "script-run-7", "HANDLER_PARENT_INSTANCE": "cron-1"})
    assert done.returncode == 0, done.stderr
    log = served.root / ".handler/calls.jsonl"
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        mine = [entry for entry in lines if entry.get("instance") == "script-run-7"]
        if mine:
            break
        time.sleep(0.05)
    assert mine, lines
    assert (mine[0]["tool"], mine[0]["profile"]) == ("echo_say", "tester")


def test_exit_2_invalid_arguments_named_before_or_by_the_router(served: Served) -> None:
    missing = served.call("echo", "echo_say", "--profile", "tester")
    assert missing.returncode == 2
    assert "--text" in missing.stderr
    not_a_number = served.call("echo", "echo_misbehave", "--profile", "tester", "--mode", "sleep", "--seconds", "x")
    assert not_a_number.returncode == 2
    assert "'x' is not a finite number" in not_a_number.stderr
    not_a_choice = served.call("echo", "echo_misbehave", "--profile", "tester", "--mode", "shout")
    assert not_a_choice.returncode == 2
    assert "invalid choice" in not_a_choice.stderr
    by_the_router = served.call("echo", "echo_say", "--profile", "tester", "--json", '{"text": "x", "loud": 1}')
    assert by_the_router.returncode == 2
    assert "invalid_arguments" in by_the_router.stderr
    assert "loud" in by_the_router.stderr
    twice = served.call("echo", "echo_say", "--profile", "tester", "--text", "a", "--json", '{"text": "b"}')
    assert twice.returncode == 2
    assert "give it once" in twice.stderr
    no_tool = served.call("echo", "echo_shout", "--profile", "tester")
    assert no_tool.returncode == 2
    assert "echo_say" in no_tool.stderr
    no_interface = served.call("tts", "tts_synthesize", "--profile", "tester")
    assert no_interface.returncode == 2
    assert "has no binding for interface 'tts'" in no_interface.stderr


@pytest.mark.parametrize(("words", "said"), [
    (["echo", "echo_misbehave", "--mode", "sleep", "--seconds", "nan"], "argument --seconds: 'nan' is not a finite"),
    (["echo", "echo_misbehave", "--mode", "sleep", "--seconds", "inf"], "argument --seconds: 'inf' is not a finite"),
    (["web-search", "web_search_query", "--query", "x", "--max-results", str(1 << 64)],
     f"argument --max-results: {1 << 64} is past the 64-bit integers a call can carry"),
    (["echo", "echo_say", "--text", b"caf\xe9"], "argument --text: 'caf\\udce9' is not UTF-8 text"),
    (["echo", "echo_misbehave", "--mode", "probe", "--paths", "a", "--paths", b"\xff"],
     "argument --paths: '\\udcff' is not UTF-8 text"),
    ([b"ech\xff", "echo_say", "--text", "a"], "argument interface: 'ech\\udcff' is not UTF-8 text"),
    (["echo", "echo_misbehave", "--mode", "sleep", "--json", '{"seconds": NaN}'],
     "handler call: 'seconds' in --json: nan is not a finite number"),
    (["echo", "echo_misbehave", "--mode", "sleep", "--json", '{"seconds": 1e999}'],
     "handler call: 'seconds' in --json: inf is not a finite number"),
    (["echo", "echo_misbehave", "--mode", "probe", "--json", f'{{"paths": [{1 << 64}]}}'],
     f"handler call: 'paths' in --json: {1 << 64} is past the 64-bit integers a call can carry"),
    (["echo", "echo_say", "--json", '{"text": "\\ud800"}'], "handler call: 'text' in --json: '\\ud800' is not UTF-8"),
])
def test_exit_2_for_a_value_no_json_line_can_carry_naming_its_flag(served: Served, words: list[str | bytes],
                                                                   said: str) -> None:
    # Such values once ended in a traceback as the line was written, or, for nan and inf, reached the tool as null.
    profile = "researcher" if words[0] == "web-search" else "tester"
    done = subprocess.run([HANDLER, "call", *words, "--profile", profile], capture_output=True, timeout=60, check=False,
                          env={**os.environ, "HANDLER_RUN_DIR": str(served.run_dir)})
    assert done.returncode == 2
    assert said in done.stderr.decode(), done.stderr
    assert b"Traceback" not in done.stderr


@pytest.mark.parametrize(("run_id", "said"), [
    ("x" * 300, "is 300 characters long; an agent run's id has at most 128"),
    (b"run-\xff", "is not UTF-8 text; an agent run's id is printable text"),
])
@pytest.mark.parametrize("command", ["handler", "handler-llm"])
def test_exit_2_before_connecting_for_a_run_id_the_router_would_refuse(tmp_path: Path, command: str,
                                                                        run_id: str | bytes, said: str) -> None:
    # Both once ended in a traceback: the length from caller_meta, the byte from orjson.
    words = ["call", "echo", "echo_say", "--text", "a"] if command == "handler" else ["hi"]
    env: dict[str | bytes, str | bytes] = {**os.environ, "HANDLER_RUN_DIR": str(tmp_path), "HANDLER_INSTANCE": run_id}
    done = subprocess.run([Path(HANDLER).with_name(command), *words, "--profile", "tester"], capture_output=True,
                          timeout=60, check=False, env=env)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"{'handler call' if command == 'handler' else 'handler-llm'}: HANDLER_INSTANCE {said}; set it to the agent "
        "run's id, or unset it to have one made per connection"]


def test_exit_2_for_json_on_stdin_that_is_not_utf8(served: Served) -> None:
    done = subprocess.run([HANDLER, "call", "echo", "echo_say", "--profile", "tester", "--json", "-"],
                          input=b'{"text": "caf\xe9"}', capture_output=True, timeout=60, check=False,
                          env={**os.environ, "HANDLER_RUN_DIR": str(served.run_dir), "LC_ALL": "C"})
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "handler call: --json is not JSON ('utf-8' codec can't decode byte 0xe9 in position 13: invalid continuation "
        "byte); give one object, e.g. --json '{\"path\": \"a.pdf\"}'"]


def test_exit_3_pending_prints_the_request_id_and_handler_status_polls_it(served: Served) -> None:
    held = served.call("echo", "echo_write", "--profile", "tester", "--text", "kept", "--output-path", "kept.txt")
    assert held.returncode == 3, held.stderr
    request_id = held.stdout.strip()
    assert request_id
    assert "held for approval" in held.stderr
    waiting = served.call("handler", "handler_status", "--profile", "tester", "--request-id", request_id)
    assert waiting.returncode == 3
    assert "pending" in waiting.stderr
    approve = subprocess.run([HANDLER, "approvals", "approve", request_id, "--as", "alice",
                              "--root", str(served.root)], capture_output=True, text=True, timeout=60, check=False)
    assert approve.returncode == 0, approve.stdout + approve.stderr
    deadline = time.monotonic() + DEADLINE
    polled = waiting
    while polled.returncode == 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        polled = served.call("handler", "handler_status", "--profile", "tester", "--request-id", request_id,
                             "--format", "json")
    assert polled.returncode == 0, polled.stderr
    assert json.loads(polled.stdout)["result"]["path"] == "kept.txt"
    assert (served.root / "work/tester/kept.txt").read_text() == "kept"


def test_exit_4_blocked(served: Served) -> None:
    blocked = served.call("echo", "echo_token", "--profile", "tester")
    assert blocked.returncode == 4, blocked.stderr
    assert "blocked" in blocked.stderr
    assert blocked.stdout == ""


def test_exit_5_an_interface_error(served: Served) -> None:
    declared = served.call("echo", "echo_misbehave", "--profile", "tester", "--mode", "error")
    assert declared.returncode == 5
    assert "empty_text" in declared.stderr
    outage = served.call("echo", "echo_misbehave", "--profile", "tester", "--mode", "rpc_error", "--format", "json")
    assert outage.returncode == 5
    assert json.loads(outage.stdout)["error"] == "unavailable"


def test_exit_1_naming_the_profiles_served_when_the_profile_is_unknown(served: Served) -> None:
    typo = served.call("echo", "echo_say", "--profile", "testr", "--text", "x")
    assert typo.returncode == 1
    assert "unknown profile 'testr'" in typo.stderr
    assert "it serves assistant, auditor, researcher, tester" in typo.stderr


def test_exit_1_when_no_router_serves_the_profile_but_help_still_lists_offline(tmp_path: Path) -> None:
    with short_dir() as run_dir:
        env = {**os.environ, "HANDLER_RUN_DIR": str(run_dir)}
        offline = subprocess.run([HANDLER, "call", "ocr", "ocr_extract", "--profile", "researcher", "--path", "a.pdf"],
                                 capture_output=True, text=True, timeout=60, check=False, env=env)
        assert offline.returncode == 1
        assert "no router is running for profile 'researcher'" in offline.stderr
        listing = subprocess.run([HANDLER, "call", "ocr", "--help", "--root", str(REPO)],
                                 capture_output=True, text=True, timeout=60, check=False, env=env)
        assert listing.returncode == 0, listing.stderr
        assert "ocr_extract" in listing.stdout
        for interface, tool in (("llm", "llm_chat"), ("llm/v1", "llm_complete")):  # the profile's, or one pinned
            fields = subprocess.run([HANDLER, "call", interface, tool, "--help", "--root", str(REPO),
                                     "--profile", "researcher"], capture_output=True, text=True, timeout=60,
                                    check=False, env=env)
            assert fields.returncode == 0, fields.stderr
            assert "--max-tokens" in fields.stdout
            assert "messages (required): an array" in fields.stdout  # given through --json


def test_flags_are_kebab_case_and_what_a_flag_cannot_say_goes_through_json() -> None:
    assert [kebab(n) for n in ("outputPath", "request_id", "maxTokens", "path")] == [
        "output-path", "request-id", "max-tokens", "path"]
    schema = {"type": "object", "required": ["format"], "properties": {
        "format": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object"}, "turns": {"type": "array", "items": {"type": "object"}},
        "level": {"enum": [1, 2]}}}
    plans = {p.name: p for p in plan_flags(schema, ("format", "json", "profile"))}
    assert plans["format"].flag is None
    assert "own option" in plans["format"].why_json
    assert plans["tags"].flag == "tags"
    assert plans["meta"].flag is None
    assert plans["turns"].why_json == "an array of objects"
    assert plans["level"].flag == "level"
