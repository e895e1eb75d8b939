"""`handler call --url URL --token TOKEN ...`: the same call against a router elsewhere, over Streamable HTTP.

`RemoteLink` stands where `call.RouterLink` stands for a socket: it lists the tools and calls one through the
profile's MCP endpoint (`URL/mcp/<profile>`) with the official MCP SDK client, the token as a bearer credential. A
`handler-file` value names a file on the caller's machine, which the router cannot read: `upload_inputs` sends each
one to the profile's work folder (`PUT URL/files/<profile>/...`, docs/hosts.md) under a fresh folder of its own and
names that copy in the arguments; each `handler-output-file` is pointed there too, and `download_outputs` fetches
what the tool wrote to the path the caller named, written whole or not at all. Called by `call.run_call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Final
from urllib.parse import quote

__all__ = ["FileCarrier", "RemoteLink", "RemoteLinkError", "endpoint_of"]

_STAGING: Final = ".handler-call"  # the folder of the profile's scope each call's files go under
_SECONDS: Final = 300.0  # how long a file may take to come or go


class RemoteLinkError(Exception):
    """The router elsewhere could not be reached, refused the credential or a file: exit 1 with this message."""


def endpoint_of(url: str, profile: str) -> tuple[str, str]:
    """(the service's base URL, the profile's MCP endpoint) of `--url`, given as either."""
    base = url.rstrip("/")
    suffix = f"/mcp/{profile}"
    base = base.removesuffix(suffix)
    if not base.startswith(("https://", "http://")):
        raise RemoteLinkError(f"--url {url!r} is not an http(s) address: give the service's address, e.g. "
                        "https://mcp.example.org")
    return base, base + suffix


class RemoteLink:
    """One session with a profile's MCP endpoint over HTTP, held open by a task of its own event loop."""

    def __init__(self, url: str, profile: str, token: str, meta: Mapping[str, str], client_name: str) -> None:
        self.meta = dict(meta)
        self.profile = profile
        self.base, self.endpoint = endpoint_of(url, profile)
        self._auth = {"Authorization": f"Bearer {token}"}
        self.files = FileCarrier(self.base, profile, token)
        self._runner = asyncio.Runner()
        self._done: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        self._refusal = ""  # the last 4xx or 5xx the endpoint answered, as the SDK's errors do not say it
        try:
            self._client: Any = self._runner.run(self._open(client_name))
        except BaseException:
            self._runner.close()
            raise

    async def _open(self, client_name: str) -> Any:
        # The SDK's client is entered and left in one task (its cancel scopes require it): `_hold` keeps it open
        # while this process's later requests run as tasks of the same loop.
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._done = asyncio.Event()
        self._holder = asyncio.create_task(self._hold(ready, client_name))
        try:
            return await ready
        except Exception as exc:
            raise RemoteLinkError(_unreached(self.endpoint, exc, self._refusal)) from None

    async def _note_refusal(self, response: Any) -> None:
        if response.status_code >= 400:
            await response.aread()
            self._refusal = f"{response.status_code}: {response.text.strip()[:2000]}"

    async def _hold(self, ready: asyncio.Future[Any], client_name: str) -> None:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
        from mcp.types import Implementation

        assert self._done is not None  # noqa: S101 - set by _open before this task starts
        http = create_mcp_http_client(headers=self._auth)
        http.event_hooks["response"].append(self._note_refusal)
        try:
            async with http, Client(streamable_http_client(self.endpoint, http_client=http),
                                    client_info=Implementation(name=client_name, version="1")) as client:
                ready.set_result(client)
                await self._done.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
                return
            raise

    def _run(self, work: Any) -> Any:
        try:
            return self._runner.run(work)
        except RemoteLinkError:
            raise
        except Exception as exc:
            raise RemoteLinkError(_unreached(self.endpoint, exc, self._refusal)) from None

    def list_tools(self) -> list[dict[str, Any]]:
        listed = self._run(self._client.list_tools(meta=self.meta))
        return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in listed.tools]

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        result = self._run(self._client.call_tool(name, dict(arguments), meta=self.meta))
        dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return dumped

    def close(self) -> None:
        if self._done is not None and self._holder is not None:
            self._done.set()
            with contextlib.suppress(Exception):
                self._runner.run(_finished(self._holder))
        self._runner.close()




class FileCarrier:
    """Moves a call's files between the caller's folder and the profile's work folder (`/files/<profile>/...`)."""

    def __init__(self, base: str, profile: str, token: str) -> None:
        self.base, self.profile = base, profile
        self._auth = {"Authorization": f"Bearer {token}"}
        self._folder = f"{_STAGING}/{secrets.token_hex(8)}"
        self._outputs: list[tuple[str, Path]] = []  # (path in the scope, the caller's path)
        self.placed: list[str] = []  # every path of the scope this carrier named, to clear after the call

    def upload_inputs(self, schema: Mapping[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
        """`arguments` with each `handler-file` value uploaded and named by its copy in the profile's scope, and each
        `handler-output-file` pointed into the same folder (remembered for `download_outputs`)."""
        from reconciler.router.files import find_file_fields, locate

        changed: dict[str, Any] = dict(arguments)
        for index, (field, where, value) in enumerate(
                (f, w, v) for f in find_file_fields(schema) for w, v in locate(arguments, f.path)):
            if not isinstance(value, str):
                continue
            local = Path(value)
            remote = f"{self._folder}/{index}/{PurePosixPath(local.name or 'file').name}"
            self.placed.append(remote)
            if field.output:
                self._outputs.append((remote, local))
            else:
                self._upload(local, remote)
            changed = _replaced(changed, where, remote)
        return changed

    def download_outputs(self) -> list[Path]:
        """Fetch what the call wrote at each output path into the caller's; the paths written."""
        written = []
        for remote, local in self._outputs:
            self._download(remote, local)
            written.append(local)
        return written

    def clear(self) -> list[str]:
        """Remove from the profile's work folder what this call put there or had written there, and the folders
        made for them; what could not be removed (an output the call did not write is simply absent)."""
        import httpx

        folders = sorted({self._folder, *(r.rsplit("/", 1)[0] for r in self.placed)}, key=len, reverse=True)
        left: list[str] = []
        for remote in [*self.placed, *folders]:
            try:
                answer = httpx.delete(self._url(remote), headers=self._auth, timeout=_SECONDS)
            except httpx.HTTPError:
                left.append(remote)
                continue
            if answer.status_code not in (204, 404):
                left.append(remote)
        return left

    def _url(self, remote: str) -> str:
        return f"{self.base}/files/{quote(self.profile)}/{quote(remote)}"

    def _upload(self, local: Path, remote: str) -> None:
        import httpx  # loaded when a call moves a file: a call over a socket never pays for it

        try:
            with local.open("rb") as file:
                answer = httpx.put(self._url(remote), content=file, headers=self._auth, timeout=_SECONDS)
        except OSError as exc:
            raise RemoteLinkError(f"cannot read {local}: {exc.strerror}") from None
        except httpx.HTTPError as exc:
            raise RemoteLinkError(f"cannot upload {local} to {self.base}: {exc}") from None
        if answer.status_code != 201:
            raise RemoteLinkError(f"the router refused the upload of {local} ({answer.status_code}): "
                                  f"{answer.text.strip()}")

    def _download(self, remote: str, local: Path) -> None:
        import httpx

        tmp = local.with_name(f".{local.name}.{secrets.token_hex(4)}.part")
        try:
            with httpx.stream("GET", self._url(remote), headers=self._auth, timeout=_SECONDS) as answer:
                if answer.status_code != 200:
                    answer.read()
                    raise RemoteLinkError(f"the router did not give back {local.name} ({answer.status_code}): "
                                    f"{answer.text.strip()}")
                with tmp.open("xb") as out:
                    for chunk in answer.iter_bytes():
                        out.write(chunk)
            tmp.replace(local)
        except httpx.HTTPError as exc:
            raise RemoteLinkError(f"cannot download {local.name} from {self.base}: {exc}") from None
        except OSError as exc:
            raise RemoteLinkError(f"cannot write {local}: {exc.strerror}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


async def _finished(task: asyncio.Task[None]) -> None:
    await task


def _replaced(node: Any, where: tuple[str | int, ...], value: str) -> Any:
    """`node` with the value at `where` replaced, the containers on the way copied."""
    if not where:
        return value
    head, rest = where[0], where[1:]
    if isinstance(node, list) and isinstance(head, int):
        return [_replaced(item, rest, value) if i == head else item for i, item in enumerate(node)]
    if isinstance(node, dict):
        return {k: _replaced(v, rest, value) if k == head else v for k, v in node.items()}
    return node


def _unreached(endpoint: str, exc: BaseException, refusal: str) -> str:
    """What went wrong reaching `endpoint`: the endpoint's own refusal when it answered one (`refusal`, "401: ..."),
    else the SDK's error, its nested exception groups unwrapped to their first cause."""
    if refusal:
        return f"cannot call {endpoint}: the router answered {refusal}"
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"cannot call {endpoint}: {str(exc) or exc.__class__.__name__}"
