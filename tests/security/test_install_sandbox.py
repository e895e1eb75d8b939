"""`handler connector install` runs a connector author's code — its packages' builds and its `[needs] setup` — in
the build's sandbox (`connectors/buildbox.py`), never as the installing user (docs/architecture.md §6).

Each attack is run as root (as CI runs) and as an unprivileged user (nobody, from the world-readable virtualenv
of `tests/fixtures/hostile/routers.py`), by the real command in a process of its own: a setup command and a PEP
517 build that go for a secret exported in the installer's shell, a stand-in for loopback PostgreSQL (a listener
of the test's own on 127.0.0.1, which records every connection) and PostgreSQL's own port, a file outside the
environment being built and `/etc/shadow`. Nothing is reached: the secret is in no output and no file, the
listener saw no connection, the outside file does not exist.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.connectors.buildbox import pip_settings
from tests.fixtures.echo_tree import write_echo_tree
from tests.fixtures.hostile.routers import MODES, NOBODY, user_venv

pytestmark = pytest.mark.timeout(900)
SECRET_ENV = "HANDLER_TEST_INSTALLER_SECRET"  # noqa: S105 - a variable's name

# What the connector's code tries, wherever it runs: each line of its report says what it reached, or why not.
PROBE = '''
import os, socket, sys, urllib.request
said = []
secret = os.environ.get({secret_env!r})
said.append("secret: " + ("READ " + secret if secret else "not in the environment"))
for port in ({port}, 5432):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        said.append(f"loopback {{port}}: REACHED")
    except OSError as exc:
        said.append(f"loopback {{port}}: {{exc.__class__.__name__}}")
try:
    urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=10)
    said.append("proxy to loopback: REACHED")
except Exception as exc:
    said.append(f"proxy to loopback: {{exc}}")
for outside in {outside!r}:  # what it writes, if anything, lands in its sandbox's own view: the host is checked
    try:
        open(outside, "w").write(secret or "written")
        said.append("outside: written in its view")
    except OSError as exc:
        said.append(f"outside: {{exc.__class__.__name__}}")
try:
    open("/etc/shadow").read()
    said.append("shadow: READ")
except OSError as exc:
    said.append(f"shadow: {{exc.__class__.__name__}}")
print("probe: " + "; ".join(said), file=sys.stderr)
'''


@dataclass
class Installer:
    mode: str
    base: Path
    secret: str
    listener: socket.socket
    outside: tuple[Path, ...]  # beside the test's files, and beside the environment being built
    wheels: Path  # a find-links folder of the installer's pip configuration

    def probe(self) -> str:
        return PROBE.format(secret_env=SECRET_ENV, port=self.listener.getsockname()[1],
                            outside=[str(p) for p in self.outside])

    def install(self, root: Path) -> subprocess.CompletedProcess[str]:
        """`handler connector install` of `root` as this mode's user, the secret exported in its environment."""
        settings = pip_settings()
        links = " ".join([*settings.get("PIP_FIND_LINKS", "").split(), str(self.wheels)])
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", SECRET_ENV: self.secret,
               "XDG_CACHE_HOME": str(self.base / "cache"), **settings, "PIP_FIND_LINKS": links}
        user = {}
        if self.mode == "user":
            handler = user_venv() / "bin/handler"
            env["HOME"] = str(self.base / "home")
            subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(self.base)], check=True, timeout=60)
            user = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        else:
            handler = Path(sys.executable).parent / "handler"
            env["HOME"] = os.environ.get("HOME", "/root")
        done = subprocess.run([str(handler), "connector", "install", "--root", str(root)], env=env, cwd=self.base,
                              capture_output=True, text=True, timeout=800, check=False, **user)  # type: ignore[call-overload]
        print(f"--- handler connector install as {self.mode} (exit {done.returncode}) ---\n{done.stdout}{done.stderr}")
        return done  # type: ignore[no-any-return]

    def reached(self) -> int:
        """How many connections the loopback stand-in accepted."""
        count = 0
        self.listener.setblocking(False)
        while True:
            try:
                self.listener.accept()[0].close()
            except BlockingIOError:
                return count
            count += 1

    def assert_nothing_reached(self, done: subprocess.CompletedProcess[str]) -> None:
        said = done.stdout + done.stderr
        assert self.secret not in said, "the installer's secret reached the build's output"
        for path in (self.base / "cache").rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert self.secret.encode() not in path.read_bytes(), f"the secret was written to {path}"
        connections = self.reached()
        written = [str(p) for p in self.outside if p.exists()]
        print(f"evidence: loopback stand-in on 127.0.0.1:{self.listener.getsockname()[1]} accepted {connections} "
              f"connection(s); of {', '.join(map(str, self.outside))} these exist on the host: {written or 'none'}")
        assert connections == 0
        assert written == []
        reports = [line[line.index("probe: "):] for line in said.splitlines() if "probe: " in line]
        assert all("REACHED" not in r and "READ" not in r for r in reports), reports


@pytest.fixture(params=MODES)
def installer(request: pytest.FixtureRequest) -> Iterator[Installer]:
    if request.param == "user" and os.geteuid() != 0:
        pytest.skip("the unprivileged run drops from root to nobody; this run is not root")
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="hi"))
    base.chmod(0o755)
    (base / "home").mkdir()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    wheels = base / "wheels"
    wheels.mkdir()
    try:
        yield Installer(request.param, base, secrets.token_hex(16), listener,
                        (base / "outside.txt", base / "cache/handler/envs/outside.txt"), wheels)
    finally:
        listener.close()
        shutil.rmtree(base, ignore_errors=True)


def tree_needing(base: Path, python: list[str], setup: list[list[str]] | None = None) -> Path:
    root = write_echo_tree(base / "t")
    manifest = root / "catalog/connectors/echo/connector.toml"
    needs = f"\n[needs]\npython = {json.dumps(python)}\n" + (f"setup = {json.dumps(setup)}\n" if setup else "")
    manifest.write_text(manifest.read_text() + needs)
    return root


def hostile_sdist(folder: Path, probe: str) -> str:
    """An sdist whose PEP 517 build (setuptools) runs `probe` first, then builds: the requirement naming it."""
    name = f"handler_probe_{secrets.token_hex(3)}"
    src = folder / f"{name}-1.0"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text("BUILT = True\n")
    (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=61"]\n'
                                         'build-backend = "setuptools.build_meta"\n'
                                         f'[project]\nname = "{name}"\nversion = "1.0"\n')
    (src / "setup.py").write_text(f"{probe}\nfrom setuptools import setup\nsetup()\n")
    with tarfile.open(folder / f"{name}-1.0.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=src.name)
    shutil.rmtree(src)
    return f"{name}==1.0"


def test_a_setup_command_reaches_no_secret_no_loopback_database_and_no_outside_file(installer: Installer) -> None:
    root = tree_needing(installer.base, ["orjson>=3.10,<4"],
                        [["python3", "-c", installer.probe() + "\nraise SystemExit(3)\n"]])
    done = installer.install(root)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "probe: secret: not in the environment" in said  # it ran, inside, and saw no secret
    port = installer.listener.getsockname()[1]
    assert f"its sandbox refused it 127.0.0.1:{port}" in said  # the proxy names what it refused
    installer.assert_nothing_reached(done)


def test_a_pep517_build_reaches_nothing_and_its_package_installs(installer: Installer) -> None:
    requirement = hostile_sdist(installer.wheels, installer.probe())
    root = tree_needing(installer.base, [requirement])
    done = installer.install(root)
    assert done.returncode == 0, done.stderr
    installer.assert_nothing_reached(done)
    built = list((installer.base / "cache/handler/envs").glob(f"*/lib/python*/site-packages/{requirement[:20]}*"))
    assert built, "the package was not installed into the environment"
