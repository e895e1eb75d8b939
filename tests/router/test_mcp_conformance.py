"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in tests/fixtures/mcp_conformance)
against the router's Streamable HTTP endpoint, serving the suite's fixture tools (tests/fixtures/suite_tree.py).

The suite sends no credential, and the product keeps no unauthenticated mode: a loopback proxy of the test's
(tests/fixtures/token_proxy.py) adds a token of the profile and passes `Host` and `Origin` through as sent. Every
scenario the router does not pass is in the suite's own expected-failures file with its reason; the suite fails
the run when one of them starts passing, so the file stays true.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.http_service import HttpServed
from tests.fixtures.suite_tree import write_suite_tree

SUITE = Path(__file__).parents[1] / "fixtures/mcp_conformance"
MUST_PASS = ("server-initialize", "ping", "tools-list", "tools-call-simple-text", "tools-call-error",
             "dns-rebinding-protection", "server-sse-multiple-streams", "tools-call-with-progress", "resources-list",
             "prompts-list")


def suite_bin() -> Path:
    """The suite's command, installed from its lock file (with the Node 22 it needs) when missing."""
    if not (SUITE / "node_modules/.bin/conformance").exists():
        npm = shutil.which("npm")
        assert npm is not None, "the conformance suite needs npm (.ci/run installs it)"
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SUITE, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0, done.stderr
    return SUITE / "node_modules/.bin"


@pytest.fixture(scope="module")
def proxied() -> Iterator[str]:
    """The suite's URL: the token proxy, in front of `handler serve --http` on the suite's tree."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="h"))
    served = HttpServed(write_suite_tree(base / "t"), base / "run")
    proxy = None
    try:
        (base / "token").write_text(served.token("suite", name="conformance"))
        proxy = subprocess.Popen([sys.executable, "-m", "tests.fixtures.token_proxy", served.base, str(base / "token")],
                                 stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
        assert proxy.stdout is not None
        yield proxy.stdout.readline().strip() + "/mcp/suite"
    finally:
        if proxy is not None:
            proxy.kill()  # a test's proxy: the streams it still copies need no goodbye
            proxy.wait(30)
            if proxy.stdout is not None:
                proxy.stdout.close()
        served.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_the_official_conformance_suite_passes_what_a_tools_server_can(proxied: str, tmp_path: Path) -> None:
    binaries = suite_bin()
    done = subprocess.run([str(binaries / "conformance"), "server", "--url", proxied, "--expected-failures",
                           str(SUITE / "expected-failures.yml")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, check=False, env={"PATH": f"{binaries}:/usr/bin:/bin"})
    summary = done.stdout[done.stdout.find("=== SUMMARY ==="):]
    assert done.returncode == 0, summary + done.stderr[-2000:]
    for scenario in MUST_PASS:  # passed outright, not let off by the baseline
        assert f"✓ {scenario}:" in summary, summary
