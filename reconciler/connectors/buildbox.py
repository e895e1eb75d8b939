"""The sandbox a connector's environment is built in (`handler connector install`, docs/config.md `[needs]`).

A package build (a PEP 517 backend, a `setup.py`) and a `[needs] setup` command are the connector
author's code, so they run as a connector does (`sandbox.boxed`, docs/architecture.md §6), never as
the installing user:

- *who*: when the installer is root, a host uid of the builds' own (`build_uid`, outside the range of
  the connectors' uids), with no capability and `no_new_privs`; the environment's folder is that uid's
  while it is built and root's again after; as an ordinary user, a user namespace mapped onto the user;
- *its view*: the system's `/usr`, the few `/etc` files a program needs, the Python the service runs on
  and its code (read-only), the local folders and files the installer's pip configuration names
  (read-only), the environment being built (the one folder it may write) and a private size-capped `/tmp`
  as HOME: not the installer's home, its secrets or the state and run folders;
- *its environment*: none of the installer's, but PATH, LANG and the pip configuration, carried in as
  `PIP_*` variables (`pip_settings`: index and extra index URLs, find-links, constraints, the CA
  certificate, as the installer's own pip reads them from its files and environment; pip reads no
  configuration file inside);
- *its network*: only the registries' hosts (`registry_egress`: pip's index hosts and, for PyPI, its
  files host; npm's registry for setup commands), through the egress proxy connectors use
  (`egress.EgressProxy`, `relay` inside): loopback, the private network and every other host refused.

Called by `environments.build_environment`.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote, urlsplit

from reconciler.connectors.egress import EgressProxy, is_global_address
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.sandbox import BoxView, Limits, boxed, confined_env, entering, write_seccomp

__all__ = ["BUILD_LIMITS", "BuildBox", "build_uid", "pip_settings", "registry_egress"]

# Below the connectors' own uids (pool.HOST_UID_BASE, 0x50000000 up): the builds', one per environment.
_BUILD_UID_BASE = 0x4F000000
_BUILD_UID_SPAN = 1 << 24
# A build unpacks wheels of hundreds of MB (torch) through /tmp and may compile for long.
BUILD_LIMITS = Limits(memory_bytes=8 << 30, cpu_seconds=3600, file_bytes=4 << 30, processes=512, tmp_bytes=3 << 30)
_TIMEOUT = 1800.0
_TMP = Path("/tmp")  # noqa: S108 - the sandbox's own: a size-capped tmpfs
_PYPI, _PYPI_FILES = "https://pypi.org/simple", "files.pythonhosted.org"
_NPM_REGISTRY = "https://registry.npmjs.org/"
# The pip settings carried into the sandbox; any other (a proxy, a target or prefix, a cache) is the sandbox's own.
_PIP_KEYS = ("index-url", "extra-index-url", "find-links", "no-index", "constraint", "cert", "client-cert",
             "trusted-host", "timeout", "default-timeout", "retries", "only-binary", "no-binary", "prefer-binary",
             "pre", "progress-bar")
_PIP_PATHS = ("constraint", "cert", "client-cert")  # settings naming local files
_PIP_URLS = ("index-url", "extra-index-url", "find-links")  # settings naming URLs, or (find-links) local folders


def build_uid(environment: Path) -> int:
    """The host uid a build of `environment` runs as when the installer is root."""
    return _BUILD_UID_BASE + zlib.crc32(environment.name.encode()) % _BUILD_UID_SPAN


def pip_settings(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The installer's pip configuration, as `PIP_*` variables: what its pip reads from its configuration files
    (`/etc/xdg/pip/pip.conf`, `/etc/pip.conf`, the user's, `PIP_CONFIG_FILE`) and its `PIP_*` variables, the
    `install` section over `global` and the variables over both, as pip itself ranks them."""
    env = dict(os.environ if source is None else source)
    for name in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    ranked: dict[str, tuple[int, str]] = {}
    for line in done.stdout.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        rank = {"global": 0, "install": 1, ":env:": 2}.get(section)
        if rank is None or key not in _PIP_KEYS:
            continue
        with contextlib.suppress(ValueError, SyntaxError):
            text = ast.literal_eval(value)
            if isinstance(text, str) and rank >= ranked.get(key, (-1, ""))[0]:
                ranked[key] = (rank, text)
    return {f"PIP_{key.upper().replace('-', '_')}": text for key, (_, text) in ranked.items()}


def _setting(settings: Mapping[str, str], key: str) -> list[str]:
    return settings.get(f"PIP_{key.upper().replace('-', '_')}", "").split()


def local_paths(settings: Mapping[str, str]) -> list[Path]:
    """The local files and folders the pip settings name (constraints, certificates, file:// indexes, find-links
    folders): shown read-only in the sandbox."""
    paths = [Path(p) for key in _PIP_PATHS for p in _setting(settings, key)]
    for key in _PIP_URLS:
        for url in _setting(settings, key):
            path = Path(unquote(urlsplit(url).path)) if url.startswith("file:") else None if "://" in url else Path(url)
            if path is not None:  # an index's pages link to its files beside them (simple/ and files/): its parent
                paths.append(path.parent if key != "find-links" and path.name == "simple" else path)
    return [p.absolute() for p in paths if p.exists()]


def registry_egress(settings: Mapping[str, str], npm_registry: str | None = None) -> list[str]:
    """The `host:port` entries a build may reach: pip's index (PyPI unless configured) and extra indexes, their
    files host for PyPI, find-links over HTTP, and npm's registry when given. A registry on this machine or its
    private network is named by its address, which the proxy then allows (docs/architecture.md §6)."""
    urls = [] if settings.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes", "on") else (
        _setting(settings, "index-url") or [_PYPI])
    urls += [u for key in ("extra-index-url", "find-links") for u in _setting(settings, key)]
    urls += [npm_registry] if npm_registry else []
    entries: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            continue
        port = parts.port or (443 if parts.scheme == "https" else 80)
        entries.append(f"{parts.hostname}:{port}")
        if parts.hostname == "pypi.org":
            entries.append(f"{_PYPI_FILES}:443")
        entries += [f"{a}:{port}" for a in _local_addresses(parts.hostname, port)]
    return list(dict.fromkeys(entries))


def _local_addresses(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    found = (str(info[4][0]) for info in infos)
    return [f"[{a}]" if ":" in a else a for a in found if not is_global_address(a)]


def npm_registry(source: Mapping[str, str] | None = None) -> str:
    """npm's registry as the installer's npm reads it (`npm config get registry`), else the public one."""
    npm = shutil.which("npm")
    if npm is None:
        return _NPM_REGISTRY
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run([npm, "config", "get", "registry"], capture_output=True, text=True, timeout=60,
                              check=False, env=dict(os.environ if source is None else source))
        if done.returncode == 0 and done.stdout.strip().startswith(("http://", "https://")):
            return done.stdout.strip()
    return _NPM_REGISTRY


class BuildBox:
    """One environment's build sandbox: its private folder (seccomp program, `/etc` files, proxy socket) and its
    egress proxy, for the build's commands, one `run` each. Use as an async context manager."""

    def __init__(self, environment: Path, egress: Sequence[str], settings: Mapping[str, str], *,
                 readable: Sequence[Path] = ()) -> None:
        self.environment = environment
        self.egress = tuple(egress)
        self.settings = dict(settings)
        self.readable = tuple(readable)  # besides the service's Python and code: pip's files, the runtime's home
        self.uid = build_uid(environment) if os.geteuid() == 0 else None
        self.folder = Path()
        self.proxy: EgressProxy | None = None

    async def __aenter__(self) -> BuildBox:
        self.folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="hb"))  # short: a unix socket's path is capped
        sock = self.folder / "sock"
        sock.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(sock, self.uid, self.uid)
            _own_tree(self.environment, self.uid)
        if self.egress:
            self.proxy = EgressProxy(sock / "egress.sock", self.egress, owner="connector install")
            await self.proxy.start()
            if self.uid is not None:
                os.chown(self.proxy.socket_path, self.uid, self.uid)
        write_seccomp(self.folder / "seccomp.bpf")
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.proxy is not None:
            await self.proxy.aclose()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.uid is not None and self.environment.exists():
            _own_tree(self.environment, 0)  # root's again: no build, and no connector, may change it

    async def run(self, command: Sequence[str], what: str, *, cwd: Path | None = None,
                  extra_env: Mapping[str, str] | None = None) -> None:
        """`command` in the sandbox; `ConnectorStartError` naming `what`, its last lines and what the proxy
        refused when it fails."""
        refused_before = self.proxy.refusals if self.proxy is not None else 0
        env = confined_env({**self.settings, **(extra_env or {})}, _TMP, tmp=_TMP, system_path=True)
        env["PATH"] = f"{self.environment / 'bin'}{os.pathsep}{env['PATH']}"
        env["PIP_CONFIG_FILE"] = os.devnull  # its settings are the variables: no file of the sandbox's is read
        inner = ["/usr/bin/env", "-C", str(cwd or self.environment), *command]
        relay = None
        if self.proxy is not None:
            relay = [sys.executable, "-m", "reconciler.connectors.relay", "--proxy", str(self.proxy.socket_path)]
        box = boxed(inner, self._view(), BUILD_LIMITS, host_uid=self.uid, relay=relay)
        process = await asyncio.create_subprocess_exec(
            *entering(self.folder / "seccomp.bpf"), *box, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, cwd="/")
        try:
            async with asyncio.timeout(_TIMEOUT):
                out, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise ConnectorStartError(f"{what} did not finish within {_TIMEOUT:.0f} s") from None
        if process.returncode != 0:
            said = out.decode(errors="replace").strip().splitlines()
            refused = self.proxy.refused[-(self.proxy.refusals - refused_before):] if (
                self.proxy is not None and self.proxy.refusals > refused_before) else []
            note = (f"; its sandbox refused it {', '.join(dict.fromkeys(refused))}, outside the registries it may "
                    f"reach ({', '.join(self.egress)})") if refused else ""
            raise ConnectorStartError(f"{what} failed in its sandbox (exit status {process.returncode}){note}: "
                                      + " / ".join(said[-6:]))

    def _view(self) -> BoxView:
        code = Path(__file__).resolve().parents[1]  # the relay runs from the service's package
        readable = {Path(sys.prefix), Path(sys.base_prefix), code, *self.readable}
        shown = {str(p.resolve()) for p in readable if p.exists()}
        kept = tuple(p for p in shown if p not in {"/", "/usr"} and not p.startswith("/usr/"))
        if self.proxy is not None:  # its socket's folder: connecting needs no write access to it
            kept += (str(self.proxy.socket_path.parent),)
        return BoxView(readable=kept, writable=(str(self.environment.resolve()),), files=self._etc())

    def _etc(self) -> dict[str, str]:
        """`/etc/passwd`, `group` and `hosts` of the sandbox, in its private folder."""
        me = self.uid if self.uid is not None else os.getuid()
        etc = self.folder / "etc"
        etc.mkdir(mode=0o755, exist_ok=True)
        nologin = "/usr/sbin/nologin"
        contents = {"passwd": f"root:x:0:0:root:/root:{nologin}\nbuild:x:{me}:{me}:build:/tmp:{nologin}\n",
                    "group": f"root:x:0:\nbuild:x:{me}:\n",
                    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"}
        for name, text in contents.items():
            (etc / name).write_text(text)
            (etc / name).chmod(0o644)
        return {f"/etc/{name}": str(etc / name) for name in contents}


def _own_tree(root: Path, uid: int) -> None:
    """Every entry under `root` (links as themselves) made `uid`'s."""
    os.lchown(root, uid, uid)
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                os.lchown(Path(folder, name), uid, uid)
