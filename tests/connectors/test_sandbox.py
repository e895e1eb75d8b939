"""The sandbox on this machine: no network but the allow-listed egress, a bare environment, rlimits."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from reconciler.connectors.egress import EgressProxy, egress_allows
from reconciler.connectors.launching import limited_command
from reconciler.connectors.netns_init import FsView
from reconciler.connectors.sandbox import (
    Limits,
    confined_env,
    mounts_available,
    namespaces_available,
    sandboxed_command,
)
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, run, serving, short_dir
from tests.fixtures.loopback import serving_page

pytestmark = pytest.mark.skipif(not namespaces_available(), reason="network namespaces are unavailable here")

FETCH = """
import os, sys, urllib.request, socket
url = sys.argv[1]
try:
    print("via-proxy:", urllib.request.urlopen(url, timeout=5).read().decode())
except Exception as exc:
    print("via-proxy failed:", getattr(exc, "code", type(exc).__name__))
host, port = url.split("//")[1].split("/")[0].split(":")
s = socket.socket()
s.settimeout(2)
print("direct:", s.connect_ex((host, int(port))))
"""


@pytest.fixture
def page() -> Iterator[str]:
    with serving_page(b"hello from the host") as url:
        yield url


async def _run_confined(script: str, url: str, egress: list[str] | None, folder: Path) -> tuple[str, list[str]]:
    proxy = None
    if egress is not None:
        proxy = EgressProxy(folder / "egress.sock", egress, owner="test-binding")
        await proxy.start()
    home = folder / "home"
    (home / "tmp").mkdir(parents=True)
    command = sandboxed_command([sys.executable, "-c", script, url], proxy.socket_path if proxy else None)
    proc = await asyncio.create_subprocess_exec(
        *command, env=confined_env({}, home), cwd=home, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    if proxy is not None:
        await proxy.aclose()
    assert proc.returncode == 0, err.decode()
    return out.decode(), proxy.refused if proxy else []


def test_a_server_in_the_egress_is_reached_through_the_proxy_only(page: str) -> None:
    port = page.split(":")[2].rstrip("/")
    with short_dir() as folder:
        out, refused = asyncio.run(_run_confined(FETCH, page, [f"127.0.0.1:{port}"], folder))
    assert "via-proxy: hello from the host" in out
    assert "direct: 111" in out  # the host's loopback is not the namespace's: connection refused
    assert refused == []


def test_a_server_outside_the_egress_is_refused_and_logged(page: str, caplog: pytest.LogCaptureFixture) -> None:
    port = page.split(":")[2].rstrip("/")
    with short_dir() as folder:
        out, refused = asyncio.run(_run_confined(FETCH, page, ["api.example.com:443"], folder))
    assert "via-proxy failed: 403" in out
    assert refused == [f"127.0.0.1:{port}"]
    assert f"tried 127.0.0.1:{port}" in caplog.text


def test_no_egress_means_no_network_at_all(page: str) -> None:
    with short_dir() as folder:
        out, _ = asyncio.run(_run_confined(FETCH, page, None, folder))
    assert "via-proxy failed" in out
    assert "direct: 111" in out


def test_the_environment_holds_only_what_was_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_SECRET", "must-not-leak")
    env = confined_env({"OCR_LANGUAGES": "eng"}, tmp_path)
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR", "OCR_LANGUAGES"}
    assert env["HOME"] == str(tmp_path)


def test_rlimits_bound_file_size(tmp_path: Path) -> None:
    import subprocess

    limits = Limits(memory_bytes=1 << 30, cpu_seconds=30, file_bytes=1 << 16)
    script = "open('big', 'wb').write(b'x' * (1 << 20))"
    command = limited_command([sys.executable, "-c", script], limits)
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, check=False)
    assert done.returncode != 0
    assert (tmp_path / "big").stat().st_size <= 1 << 16


def test_egress_entries_match_hosts_and_ports() -> None:
    assert egress_allows(["api.mistral.ai:443"], "API.mistral.ai", 443)
    assert not egress_allows(["api.mistral.ai:443"], "api.mistral.ai", 80)
    assert egress_allows(["*:587"], "smtp.example.org", 587)
    assert egress_allows(["smtp.example.org:*"], "smtp.example.org", 2525)
    assert not egress_allows([], "localhost", 80)


def test_a_sandboxed_connector_sees_none_of_the_routers_private_files(tmp_path: Path) -> None:
    if not mounts_available():
        pytest.skip("mount namespaces are unavailable here")
    with short_dir() as base:
        root = write_echo_tree(base / "t", profiles=("tester", "other"))
        secret_file = root / "secrets/api-key.txt"  # inside the config tree, which the connector may read
        secret_file.parent.mkdir()
        secret_file.write_text("file-secret-value")
        other = root / "config/bindings/echo-local.toml"
        other.write_text(other.read_text().replace(f'{{ env = "{TOKEN_ENV}" }}', f'{{ file = "{secret_file}" }}'))
        home_secret = Path.home() / f".handler-test-{base.name}"
        home_secret.write_text("the user's credentials")
        run_dir = base / "run"

        async def scenario() -> dict[str, str]:
            async with serving(root, run_dir) as router:  # sandboxed: the default
                client = await RawClient.connect(router.socket_path("tester"))
                await client.call("echo_say", {"text": "leave a line in the call log"})
                router.services.log.flush()
                paths = [str(run_dir / "profiles"), str(router.state_dir), str(router.state_dir / "calls.jsonl"),
                         str(secret_file), str(home_secret), str(run_dir / "calls")]
                result = await client.call("echo_misbehave", {"mode": "probe", "paths": paths})
                planted = [str(root / "catalog/connectors/echo/main.py"), str(Path(sys.prefix) / "planted.pth"),
                           str(root / "config/bindings/planted.toml")]
                touched = await client.call("echo_misbehave", {"mode": "touch", "paths": planted})
                assert set(orjson.loads(touched["structuredContent"]["text"]).values()) == {
                    "refused: Read-only file system"}  # no code of another connector, nor of the router, to rewrite
                token = await client.call("echo_token", {})
                assert token["structuredContent"] == {"token": "file-secret-value"}  # its own secret, by env
                # The S4 path still works: the call folder it is handed is its own.
                (root / "work/tester/doc.txt").write_text("readable through the call folder")
                read = await client.call("echo_read", {"path": "doc.txt"})
                assert read["structuredContent"]["bytes"] == len("readable through the call folder")
                await client.close()
                seen: dict[str, str] = orjson.loads(result["structuredContent"]["text"])
                return {k.replace(str(run_dir), "RUN").replace(str(router.state_dir), "STATE"): v
                        for k, v in seen.items()}

        try:
            seen = run(scenario())
        finally:
            home_secret.unlink()
            (Path(sys.prefix) / "planted.pth").unlink(missing_ok=True)  # had the freeze failed
    assert seen["RUN/profiles"] == "missing"  # no profile's socket to impersonate
    assert seen["STATE"] == "folder: connectors"  # the store, the call log, the link key: gone
    assert seen["STATE/calls.jsonl"] == "missing"
    assert seen[str(secret_file)] == "file: "  # a file named as a secret reads as empty
    assert seen[str(home_secret)] == "missing"
    assert seen["RUN/calls"] == "folder: echo-local"  # its own call folders only


def test_a_folder_hidden_inside_one_bound_back_stays_hidden(tmp_path: Path) -> None:
    """A home hidden, the config tree in it bound back read-only, its state folder hidden again, the
    connector's own folder in that bound back writable: each layer as asked."""
    if not mounts_available():
        pytest.skip("mount namespaces are unavailable here")
    home = tmp_path / "home"
    own = home / "tree/.handler/connectors/x"
    own.mkdir(parents=True)
    (home / "tree/.handler/handler.db").write_text("the store")
    (home / "tree/catalog").mkdir()
    (home / "tree/catalog/code.py").write_text("code")
    (home / ".ssh").mkdir()
    (home / ".ssh/id").write_text("key")
    view = FsView(hidden=(str(home), str(home / "tree/.handler")), writable=(str(own),),
                  readable=(str(home / "tree"),))
    probe = f"""
import json, os, sys
from pathlib import Path
from reconciler.connectors.netns_init import FsView, apply_view
apply_view(FsView.from_arg(sys.argv[1]))
home = Path({str(home)!r})
def writable(p):
    try:
        (p / "w").write_text("w")
        return True
    except OSError:
        return False
print(json.dumps({{
    "home": sorted(os.listdir(home)),
    "state": sorted(os.listdir(home / "tree/.handler")),
    "code": (home / "tree/catalog/code.py").read_text(),
    "tree_writable": writable(home / "tree"),
    "own_writable": writable(home / "tree/.handler/connectors/x"),
}}))
"""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c", probe,
                           view.to_arg()], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"home": ["tree"], "state": ["connectors"], "code": "code",
                                       "tree_writable": False, "own_writable": True}
    assert (own / "w").read_text() == "w"  # the connector's folder is the real one
