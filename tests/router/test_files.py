"""S4: file arguments resolved inside the profile's scope, every escape refused, copies in and out."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from reconciler.router.files import ANY, FileField, find_file_fields, restore_paths
from reconciler.router.server import Router
from tests.fixtures.harness import RawClient, exchange


@pytest.fixture
def scope(echo_root: Path) -> Path:
    work = echo_root / "work/tester"
    (work / "doc.txt").write_text("inside the scope")
    (work / "sub").mkdir()
    (work / "big.bin").write_bytes(b"x" * 1001)  # maxFileBytes is 1000
    (echo_root / "secret.txt").write_text("outside the scope")
    outside = echo_root / "elsewhere"
    outside.mkdir()
    (outside / "x.txt").write_text("outside too")
    (work / "link-out").symlink_to(echo_root / "secret.txt")
    (work / "dir-out").symlink_to(outside)
    (work / "link-in").symlink_to(work / "doc.txt")
    return work


ESCAPES_IN = [
    ("../secret.txt", "contains '..'"),
    ("sub/../../secret.txt", "contains '..'"),
    ("/etc/passwd", "outside the work folder"),
    ("link-out", "through a symbolic link"),
    ("dir-out/x.txt", "through a symbolic link"),
    ("missing.txt", "there is no file"),
    ("sub", "not a regular file"),
    ("", "empty"),
]


@pytest.mark.parametrize(("path", "why"), ESCAPES_IN)
def test_every_input_escape_is_refused(echo_root: Path, scope: Path, run_dir: Path, path: str, why: str) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": path})
        assert result["structuredContent"]["error"] == "invalid_arguments", result
        assert why in result["structuredContent"]["message"]
        assert result["structuredContent"]["message"].startswith("/path: ")
        assert router.services.pool.processes() == []  # refused before any connector started
        assert "echo-local" not in router.services.pool.statuses

    exchange(echo_root, run_dir, script)


def test_an_absolute_path_outside_the_scope_is_refused_even_when_it_exists(echo_root: Path, scope: Path,
                                                                         run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": str(echo_root / "secret.txt")})
        assert "outside the work folder" in result["structuredContent"]["message"]

    exchange(echo_root, run_dir, script)


def test_an_input_over_max_file_bytes_is_too_large(echo_root: Path, scope: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": "big.bin"})
        assert result["structuredContent"]["error"] == "too_large"
        assert "1001 bytes" in result["structuredContent"]["message"]

    exchange(echo_root, run_dir, script)


@pytest.mark.parametrize("path", ["doc.txt", "link-in", "./doc.txt", "ABS"])
def test_the_connector_reads_a_copy_and_the_agent_sees_its_own_path(echo_root: Path, scope: Path, run_dir: Path,
                                                                   path: str) -> None:
    given = str(scope / "doc.txt") if path == "ABS" else path

    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": given})
        assert result["isError"] is False, result
        out = result["structuredContent"]
        assert out == {"bytes": 16, "sha256": hashlib.sha256(b"inside the scope").hexdigest(), "path": given}
        seen = (router.state_dir / "connectors/echo-local.stderr.log").read_text().splitlines()[-1]
        assert seen.startswith(f"echo_read got {run_dir / 'calls/echo-local'}/")  # a copy, never the agent's file
        assert list((run_dir / "calls/echo-local").iterdir()) == []  # the per-call folder is gone after the call

    exchange(echo_root, run_dir, script)


ESCAPES_OUT = [
    ("../x.txt", "contains '..'"),
    ("/tmp/x.txt", "outside the work folder"),
    ("dir-out/new.txt", "through a symbolic link"),
    ("link-out", "through a symbolic link"),
    ("doc.txt/inner.txt", "goes through a file"),
    ("sub", "is a folder"),
    (".", "names the work folder itself"),
]


@pytest.mark.parametrize(("path", "why"), ESCAPES_OUT)
def test_every_output_escape_is_refused(echo_root: Path, scope: Path, run_dir: Path, path: str, why: str) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "hi", "outputPath": path})
        assert result["structuredContent"]["error"] == "invalid_arguments", result
        assert why in result["structuredContent"]["message"]
        assert (echo_root / "secret.txt").read_text() == "outside the scope"

    exchange(echo_root, run_dir, script)


def test_an_output_is_moved_into_the_scope_at_the_agents_path(echo_root: Path, scope: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "written by the connector", "outputPath": "out/new/reply.txt"})
        assert result["isError"] is False, result
        assert result["structuredContent"] == {"path": "out/new/reply.txt", "bytes": 24}
        assert (scope / "out/new/reply.txt").read_text() == "written by the connector"
        again = await c.call("echo_write", {"text": "replaced", "outputPath": "out/new/reply.txt"})
        assert again["isError"] is False
        assert (scope / "out/new/reply.txt").read_text() == "replaced"
        assert not [p for p in (scope / "out/new").iterdir() if p.name.startswith(".handler-")]

    exchange(echo_root, run_dir, script)


def test_an_output_over_max_file_bytes_is_unavailable(echo_root: Path, scope: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "y" * 2000, "outputPath": "huge.txt"})
        assert result["_meta"]["handler/cause"] == "output_too_large"
        assert not (scope / "huge.txt").exists()

    exchange(echo_root, run_dir, script)


def test_file_fields_are_found_once_through_refs_and_arrays() -> None:
    schema = {
        "type": "object",
        "properties": {
            "single": {"type": "string", "format": "handler-file"},
            "many": {"type": "array", "items": {"$ref": "#/$defs/doc"}},
            "nested": {"type": "object", "properties": {"out": {"type": "string", "format": "handler-output-file"}}},
            "plain": {"type": "string"},
        },
        "$defs": {"doc": {"type": "object", "properties": {"path": {"type": "string", "format": "handler-file"}}}},
    }
    assert find_file_fields(schema) == (
        FileField(("single",), output=False),
        FileField(("many", ANY, "path"), output=False),
        FileField(("nested", "out"), output=True),
    )


def test_restoring_paths_touches_only_exact_matches() -> None:
    back = {"/run/calls/1/in/0-a.pdf": "a.pdf"}
    value = {"path": "/run/calls/1/in/0-a.pdf", "items": ["/run/calls/1/in/0-a.pdf", "other"], "n": 3}
    assert restore_paths(value, back) == {"path": "a.pdf", "items": ["a.pdf", "other"], "n": 3}
