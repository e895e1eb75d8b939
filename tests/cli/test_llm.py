"""`handler-llm`'s arguments as a script gives them: a value no call can carry is refused before it connects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HANDLER_LLM = str(Path(sys.executable).with_name("handler-llm"))


@pytest.mark.parametrize(("words", "said"), [
    (["--temperature", "nan", "hi"], "argument --temperature: 'nan' is not a finite number"),
    (["--temperature", "inf", "hi"], "argument --temperature: 'inf' is not a finite number"),
    (["--max-tokens", str(1 << 64), "hi"], f"argument --max-tokens: {1 << 64} is past the 64-bit integers"),
    ([b"caf\xe9"], "argument prompt: 'caf\\udce9' is not UTF-8 text"),
    (["--system", b"\xff", "hi"], "argument --system: '\\udcff' is not UTF-8 text"),
])
def test_a_value_no_call_can_carry_is_a_usage_error(tmp_path: Path, words: list[str | bytes], said: str) -> None:
    done = subprocess.run([HANDLER_LLM, "--profile", "researcher", *words], capture_output=True, timeout=60,
                          check=False, env={**os.environ, "HANDLER_RUN_DIR": str(tmp_path)})
    assert done.returncode == 2
    assert said in done.stderr.decode(), done.stderr
    assert b"no router is running" not in done.stderr  # said before it tried the socket


def test_a_prompt_on_stdin_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([HANDLER_LLM, "--profile", "researcher"], input=b"caf\xe9", capture_output=True, timeout=60,
                          check=False, env={**os.environ, "HANDLER_RUN_DIR": str(tmp_path), "LC_ALL": "C"})
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "handler-llm: the prompt on stdin is not UTF-8 text ('utf-8' codec can't decode byte 0xe9 in position 3: "
        "unexpected end of data)"]
