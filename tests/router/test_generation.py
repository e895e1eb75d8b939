"""Compiling a snapshot once: views per profile and interface, validators shared and kept across swaps."""

from __future__ import annotations

from pathlib import Path

import orjson

from reconciler.router.generation import ValidatorCache, compile_generation
from tests.fixtures.harness import load


def test_validators_are_compiled_once_and_kept_across_generations(echo_root: Path) -> None:
    cache = ValidatorCache()
    first = compile_generation(load(echo_root), 1, echo_root, cache)
    second = compile_generation(load(echo_root), 2, echo_root, cache)
    a = first.view("tester", "echo").tools["echo_say"]
    b = second.view("tester", "echo").tools["echo_say"]
    assert a.compiled is b.compiled  # the same interface content: nothing recompiled
    assert first.view("tester", "echo/v1") is first.view("tester", "echo")


def test_a_view_lists_exactly_the_interfaces_tools_then_the_builtins(echo_root: Path) -> None:
    generation = compile_generation(load(echo_root), 1, echo_root)
    listed = orjson.loads(generation.view("tester", "echo").list_handshake)["tools"]
    tools_json = orjson.loads((echo_root / "catalog/interfaces/echo/v1/tools.json").read_bytes())
    assert listed[: len(tools_json)] == tools_json
    assert [t["name"] for t in listed[len(tools_json):]] == ["handler_status", "handler_decide"]
    plan = generation.view("tester", "echo").tools["echo_say"]
    assert (plan.binding, plan.price, plan.limits.maxFileBytes) == ("echo-local", 0.001, 1000)
    assert plan.scope.given == str(echo_root.absolute() / "work/tester")
