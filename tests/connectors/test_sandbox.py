"""The sandbox on this machine: no network but the allow-listed egress, a bare environment, rlimits, a view
built from nothing (docs/architecture.md §6). Attacks from inside are tests/security's."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from reconciler.connectors.egress import EgressProxy, egress_allows
from reconciler.connectors.launching import limited_command, raw_forwards
from reconciler.connectors.relay import Forward
from reconciler.connectors.sandbox import (
    BoxView,
    Limits,
    boxed,
    confined_env,
    entering,
    sandbox_support,
    write_seccomp,
)
from tests.fixtures.echo_connector import FILL, FILL_SOCKET
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, run, serving, short_dir
from tests.fixtures.loopback import serving_page

CODE = Path(__file__).resolve().parents[2] / "reconciler"
LIMITS = Limits(memory_bytes=1 << 30, cpu_seconds=60, file_bytes=1 << 24, processes=64, tmp_bytes=8 << 20)
UID = 0x50000000 + 4242 if os.geteuid() == 0 else None  # a connector's own host uid when the router is root

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
print("direct:", s.connect_ex(("10.0.0.1", int(port))))
"""

RAW = """
import socket, sys
host, port = sys.argv[1].split(":")
try:
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"EHLO")
        print("raw:", s.recv(100).decode() or "closed")
except OSError as exc:
    print("raw failed:", exc)
print("hosts:", open("/etc/hosts").read().replace(chr(10), " | "))
"""

VIEW = """
import json, os
def state(p):
    try:
        return sorted(os.listdir(p)) if os.path.isdir(p) else open(p).read()
    except OSError as exc:
        return exc.strerror
def write(p):
    try:
        open(p, "w").write("x")
        return "written"
    except OSError as exc:
        return exc.strerror
import socket
def family(number):
    try:
        socket.socket(number, socket.SOCK_STREAM).close()
        return "opened"
    except OSError as exc:
        return exc.strerror
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print(json.dumps({"root": state("/"), "run": state("/run"), "usr": write("/usr/planted"), "tmp": write("/tmp/ok"),
    "pids": [p for p in os.listdir("/proc") if p.isdigit()], "uid": os.getuid(), "cap": status["CapEff"].strip(),
    "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "vsock": family(40), "alg": family(38), "inet": family(socket.AF_INET)}))
"""


@pytest.fixture
def page() -> Iterator[str]:
    with serving_page(b"hello from the host") as url:
        yield url


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(b"echo:" + data)


@pytest.fixture
def tcp_echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def _run_confined(script: str, arg: str, egress: list[str] | None, folder: Path) -> tuple[str, list[str]]:
    """`script` in a sandbox as a launch builds one: the service's Python and code readable, `folder/sock` for
    the proxy's socket, and the relay when there is egress."""
    proxy = relay = None
    sock = folder / "sock"
    sock.mkdir()
    if UID is not None:
        os.chown(sock, UID, UID)
    if egress is not None:
        proxy = EgressProxy(sock / "egress.sock", egress, owner="test-binding")
        await proxy.start()
        if UID is not None:
            os.chown(proxy.socket_path, UID, UID)
        forwards, hosts = raw_forwards(egress)
        relay = [sys.executable, "-m", "reconciler.connectors.relay", "--proxy", str(proxy.socket_path),
                 *(a for f in forwards for a in ("--forward", f.to_arg()))]
        (folder / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a}\t{h}\n" for h, a in hosts.items()))
        (folder / "hosts").chmod(0o644)
    write_seccomp(folder / "seccomp.bpf")
    files = {"/etc/hosts": str(folder / "hosts")} if egress is not None else {}
    view = BoxView(readable=(str(CODE), sys.prefix, sys.base_prefix), writable=(str(sock),), files=files)
    command = [*entering(folder / "seccomp.bpf"),
               *boxed([sys.executable, "-c", script, arg], view, LIMITS, host_uid=UID, relay=relay)]
    proc = await asyncio.create_subprocess_exec(
        *command, env=confined_env({}, Path("/tmp"), system_path=True), cwd=folder,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    if proxy is not None:
        await proxy.aclose()
    assert proc.returncode == 0, err.decode()
    return out.decode(), proxy.refused if proxy else []


def test_this_machine_can_sandbox() -> None:
    """CI installs bubblewrap; were it missing, every sandboxed test would fail for that reason alone."""
    support = sandbox_support()
    assert support.ok, support.reason
    assert support.privileged == (os.geteuid() == 0)


def test_a_server_in_the_egress_is_reached_through_the_proxy_only(page: str) -> None:
    port = page.split(":")[2].rstrip("/")
    with short_dir() as folder:
        out, refused = asyncio.run(_run_confined(FETCH, page, [f"127.0.0.1:{port}"], folder))
    assert "via-proxy: hello from the host" in out
    assert "direct: 101" in out  # no route out of the namespace: network unreachable
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
    assert "direct: 101" in out


def test_egress_that_is_not_http_gets_a_raw_forward(tcp_echo: int) -> None:
    """`smtplib` ignores HTTPS_PROXY: an entry naming an exact address and port is forwarded as plain TCP."""
    with short_dir() as folder:
        out, refused = asyncio.run(_run_confined(RAW, f"127.0.0.1:{tcp_echo}", [f"127.0.0.1:{tcp_echo}"], folder))
    assert "raw: echo:EHLO" in out
    assert refused == []


def test_a_named_host_is_forwarded_and_the_proxy_still_decides(tcp_echo: int) -> None:
    """A name gets a loopback address of its own in the sandbox's /etc/hosts; the proxy resolves the name and
    refuses an address the entry does not name (here the host's loopback, behind the name `localhost`)."""
    with short_dir() as folder:
        out, refused = asyncio.run(_run_confined(RAW, f"localhost:{tcp_echo}", [f"localhost:{tcp_echo}"], folder))
    assert "127.0.0.2\tlocalhost" in out
    assert "echo:" not in out  # the connection was closed without reaching the server
    assert refused == [f"localhost:{tcp_echo}"]


def test_raw_forwards_are_made_for_exact_entries_only() -> None:
    forwards, hosts = raw_forwards(["smtp.example.org:587", "*:443", "api.example.com:*", "127.0.0.1:2525",
                                    "203.0.113.9:25", "smtp.example.org:465"])
    assert forwards == [Forward("127.0.0.2", 587, "smtp.example.org:587"),
                        Forward("127.0.0.1", 2525, "127.0.0.1:2525"), Forward("127.0.0.2", 465, "smtp.example.org:465")]
    assert hosts == {"smtp.example.org": "127.0.0.2"}


def test_the_view_is_built_from_nothing() -> None:
    with short_dir() as folder:
        out, _ = asyncio.run(_run_confined(VIEW, "-", None, folder))
    seen = json.loads(out)
    tops = {p.split("/")[1] for p in (str(CODE), sys.prefix, sys.base_prefix)}
    assert set(seen["root"]) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp",
                                 "calls", *tops}
    assert seen["run"] == "No such file or directory"
    assert seen["usr"] == "Read-only file system"
    assert seen["tmp"] == "written"
    assert len(seen["pids"]) <= 3  # bubblewrap's init and the script: no router, no other tenant
    assert seen["cap"] == "0000000000000000"
    assert seen["nnp"] == "1"
    assert seen["seccomp"] == "2"  # filtering
    assert seen["vsock"] == seen["alg"] == "Address family not supported by protocol"  # no hypervisor, no kernel crypto
    assert seen["inet"] == "opened"
    if UID is not None:
        assert seen["uid"] == UID  # the router is root: the connector is not


def test_the_environment_holds_only_what_was_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_SECRET", "must-not-leak")
    env = confined_env({"OCR_LANGUAGES": "eng"}, tmp_path)
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR", "OCR_LANGUAGES"}
    assert env["HOME"] == str(tmp_path)


def test_rlimits_bound_file_size(tmp_path: Path) -> None:
    limits = Limits(memory_bytes=1 << 30, cpu_seconds=30, file_bytes=1 << 16, processes=64, tmp_bytes=1 << 20)
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
    with short_dir() as base:
        root = write_echo_tree(base / "t", profiles=("tester", "other"))
        secret_file = root / "secrets/api-key.txt"  # inside the config tree, of which it sees only its connector
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
                # no code of another connector, nor of the router, to rewrite; no binding to add
                assert all(v.startswith("refused") for v in orjson.loads(touched["structuredContent"]["text"]).values())
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
    assert seen["STATE"] == "missing"  # the store, the call log, the link key: not there at all
    assert seen["STATE/calls.jsonl"] == "missing"
    assert seen[str(secret_file)] == "missing"  # another binding's secret file
    assert seen[str(home_secret)] == "missing"
    assert seen["RUN/calls"] == "missing"  # its calls' files are in its own call space (a tmpfs), not the host's


def test_a_connector_filling_its_call_space_is_stopped_at_its_disk_mb(caplog: pytest.LogCaptureFixture) -> None:
    """RLIMIT_FSIZE bounds each file, not how many: a connector writing 1 MiB files into the folder its output goes
    to is stopped by the kernel at its [sandbox] diskMb (its call space is a tmpfs of that size), nothing of it
    reaches the host's run folder, and once its call folder is removed the next call has the room again."""
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        manifest = root / "catalog/connectors/echo/connector.toml"
        manifest.write_text(manifest.read_text() + "\n[sandbox]\ndiskMb = 8\n")
        run_dir = base / "run"

        async def scenario() -> tuple[dict[str, Any], float, dict[str, Any], list[str], str]:
            async with serving(root, run_dir) as router:
                client = await RawClient.connect(router.socket_path("tester"))
                started = time.monotonic()
                filled = await client.call("echo_write", {"text": FILL, "outputPath": "filled.txt"})
                took = time.monotonic() - started
                again = await client.call("echo_write", {"text": "after", "outputPath": "after.txt"})
                await client.close()
                said = (router.state_dir / "connectors/echo-local.stderr.log").read_text()
                return filled, took, again, sorted(p.name for p in run_dir.rglob("fill-*")), said

        with caplog.at_level(logging.INFO, logger="handler.connectors"):
            filled, took, again, left, said = run(scenario(), timeout=60)
        assert (root / "work/tester/after.txt").read_text() == "after"
    assert filled["isError"] is True, filled  # no room left for its output either
    assert took < 15, took  # not the 30 s it meant to write for
    stopped = re.search(r"echo_write filled /calls/\S+: stopped after (\d+) files: No space left on device", said)
    assert stopped is not None, said
    assert int(stopped[1]) <= 8
    assert again["structuredContent"] == {"path": "after.txt", "bytes": 5}, again
    assert left == []


def test_an_input_larger_than_the_room_left_in_the_call_space_is_unavailable_saying_so() -> None:
    with short_dir() as base:
        root = write_echo_tree(base / "t", limits={"maxFileBytes": 3 << 20})
        manifest = root / "catalog/connectors/echo/connector.toml"
        manifest.write_text(manifest.read_text() + "\n[sandbox]\ndiskMb = 1\n")
        (root / "work/tester/big.bin").write_bytes(b"x" * (2 << 20))
        (root / "work/tester/small.bin").write_bytes(b"x" * 1000)

        async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
            async with serving(root, base / "run") as router:
                client = await RawClient.connect(router.socket_path("tester"))
                big = await client.call("echo_read", {"path": "big.bin"})
                small = await client.call("echo_read", {"path": "small.bin"})  # the room given back
                await client.close()
                return big, small

        big, small = run(scenario(), timeout=60)
    assert big["isError"] is True, big
    assert big["_meta"]["handler/cause"] == "no_room", big
    assert "no room for 'big.bin' (2097152 bytes)" in big["content"][0]["text"], big
    assert small["structuredContent"]["bytes"] == 1000, small


def test_a_socket_connector_filling_its_socket_folder_is_killed_and_what_it_left_is_removed(
        caplog: pytest.LogCaptureFixture) -> None:
    """The one host folder a sandboxed connector may write is a socket connector's socket folder (where it listens):
    over its [sandbox] diskMb there, it is killed (its call fails), its files go, and the next call runs."""
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        manifest = root / "catalog/connectors/echo/connector.toml"
        manifest.write_text(manifest.read_text().replace('transport = "stdio"', 'transport = "socket"')
                            + "\n[sandbox]\ndiskMb = 8\n")
        run_dir = base / "run"

        async def scenario() -> tuple[dict[str, Any], float, dict[str, Any], list[str]]:
            async with serving(root, run_dir) as router:
                client = await RawClient.connect(router.socket_path("tester"))
                started = time.monotonic()
                filled = await client.call("echo_write", {"text": FILL_SOCKET, "outputPath": "filled.txt"})
                took = time.monotonic() - started
                again = await client.call("echo_say", {"text": "after"})
                await client.close()
                return filled, took, again, sorted(p.name for p in router.state_dir.rglob("fill-*"))

        with caplog.at_level(logging.INFO, logger="handler.connectors"):
            filled, took, again, left = run(scenario(), timeout=60)
    assert (filled["isError"], filled["_meta"]["handler/cause"]) == (True, "crashed"), filled
    assert took < 15, took  # not the 30 s it meant to write for
    assert again["structuredContent"] == {"text": "after"}
    # What it wrote between the kill and its end (bubblewrap's death ends the sandbox a moment later) is left to the
    # next check, which counts it against the same diskMb.
    assert len(left) <= 8, left
    assert "more than 8 MiB (its [sandbox] diskMb)" in caplog.text


def test_without_bubblewrap_connectors_do_not_start_and_the_message_says_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import reconciler.connectors.sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name, *a, **k: None)
    support = sandbox_support.__wrapped__()
    assert not support.ok
    assert "bubblewrap is not installed" in support.reason
    assert "apt-get install bubblewrap" in support.reason
    assert "--no-sandbox" in support.reason


def test_where_user_namespaces_are_refused_the_message_names_the_sysctl(monkeypatch: pytest.MonkeyPatch) -> None:
    """As an ordinary user on a machine that refuses user namespaces (Ubuntu 24.04's AppArmor default), bubblewrap
    fails; stood in for here by a bwrap that fails the same way."""
    import reconciler.connectors.sandbox as sandbox_module

    with short_dir() as folder:
        fake = folder / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setattr(sandbox_module.shutil, "which", lambda name, *a, **k: str(fake))
        support = sandbox_support.__wrapped__()
    assert not support.ok
    assert "setting up uid map: Permission denied" in support.reason
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in support.reason
    assert "--no-sandbox" in support.reason
