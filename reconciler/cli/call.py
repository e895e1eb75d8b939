"""`handler call INTERFACE TOOL --profile P [--FIELD VALUE ...] [--json '{...}']`: any tool from a script.

It speaks to the profile's socket like any agent (docs/router.md, "handler call"), or with `--url` to the profile's
MCP endpoint over HTTP, moving the files of the call both ways (`remote.py`, docs/hosts.md): it lists the
interface's tools (the router's live `tools/list`, or the config tree's `tools.json` when no router
answers, so `--help` works offline), builds flags from the tool's `inputSchema` (`flags.py`), calls
the tool once and prints the result. `_meta` names the interface and, when set,
`HANDLER_INSTANCE` / `HANDLER_PARENT_INSTANCE`, as the bridge does, so a script's calls count as one
agent run: same governance, limits and call log.

Exit codes: 0 executed, 2 invalid arguments (the command's or the tool's), 3 pending (the request
id on stdout), 4 blocked, 5 an interface error, 1 anything else (no router, a protocol failure).
`handler call handler handler_status --request-id ID` polls a hold with the same codes: 0 once it
ran (its result printed), 3 while it waits, 4 rejected, 5 failed or unknown.

Results are read in either shape the router may send: the body from `structuredContent` when
present, else from the JSON of the first text block (an error result carries none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from reconciler.cli.common import folder_path, load_tree
from reconciler.cli.flags import add_field_flags, carried_text, collect_arguments, plan_flags
from reconciler.cli.remote import RemoteLink, RemoteLinkError
from reconciler.places import default_run_dir, socket_path, why_unreachable
from reconciler.wire.client import LineClient
from reconciler.wire.errors import INVALID_PARAMS, HandlerError, JsonRpcError, LineClosedError
from reconciler.wire.meta import CAUSE, RETRY, STATUS, caller_meta
from reconciler.wire.results import result_body

__all__ = [
    "EXIT_BLOCKED", "EXIT_ERROR", "EXIT_EXECUTED", "EXIT_FAILED", "EXIT_INVALID", "EXIT_PENDING",
    "LinkError", "RouterLink", "add_call_command", "caller_of", "connect", "outcome_of", "read_body", "render_text",
    "run_call",
]

EXIT_EXECUTED: Final = 0
EXIT_FAILED: Final = 1
EXIT_INVALID: Final = 2
EXIT_PENDING: Final = 3
EXIT_BLOCKED: Final = 4
EXIT_ERROR: Final = 5

_OWN = ("profile", "json", "format", "run-dir", "root", "url", "token", "help", "h")  # words a field may not take
# What a polled hold's status means to a script (handler_status).
_HOLD_EXITS: Final = {"executed": EXIT_EXECUTED, "pending": EXIT_PENDING, "rejected": EXIT_BLOCKED,
                      "blocked": EXIT_BLOCKED, "failed": EXIT_ERROR, "unknown": EXIT_ERROR}


def add_call_command(sub: Any) -> None:
    """List `call` among the commands; `reconciler.cli.main` hands its words to `run_call` before parsing."""
    call = sub.add_parser("call", add_help=False, help="call one tool of a profile's interface, its flags built "
                          "from the tool's schema (`handler call INTERFACE --help` lists the tools)")
    call.add_argument("words", nargs=argparse.REMAINDER, help="the interface, the tool and its flags (see handler "
                      "call --help)")
    call.set_defaults(run=lambda args: run_call(args.words))


class LinkError(Exception):
    """The router could not be reached or broke the exchange: exit 1 with this message."""


class RouterLink:
    """One connection to a profile's socket, initialized, with its own event loop; a context manager."""

    def __init__(self, path: Path, meta: Mapping[str, str], client_name: str) -> None:
        self.meta = dict(meta)
        self._runner = asyncio.Runner()
        try:
            self._client = self._runner.run(self._open(path, client_name))
        except BaseException:
            self._runner.close()
            raise

    async def _open(self, path: Path, client_name: str) -> LineClient:
        client = await LineClient.connect_unix(path, name="the router")
        try:
            await client.initialize({"name": client_name, "version": "1"}, meta=self.meta)
        except BaseException:
            client.close()
            raise
        return client

    def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One request with the caller's `_meta`; JsonRpcError when the router refuses it."""
        try:
            return self._runner.run(self._client.request(method, {**params, "_meta": self.meta}))
        except LineClosedError:
            raise LinkError("the router closed the connection before answering") from None

    def list_tools(self) -> list[dict[str, Any]]:
        return list(self.request("tools/list", {}).get("tools") or [])

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": dict(arguments)})

    def close(self) -> None:
        self._client.close()
        self._runner.close()

    def __enter__(self) -> RouterLink:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def caller_of(profile: str | None, interface: str) -> dict[str, str]:
    """The `_meta` of this process's calls of `interface`; ValueError, before anything connects, when no profile is
    named or the environment names a run id the router would refuse (`caller_meta`)."""
    if not profile:
        raise ValueError("name the profile with --profile or HANDLER_PROFILE")
    return caller_meta(interface, os.environ)


def connect(profile: str, run_dir: Path | None, meta: Mapping[str, str], client_name: str) -> RouterLink:
    """A link to `profile`'s socket with the caller's `meta` (`caller_of`); LinkError when no router serves the
    profile there."""
    run_dir = run_dir or default_run_dir()
    path = socket_path(run_dir, profile)
    try:
        return RouterLink(path, meta, client_name)
    except OSError as exc:
        raise LinkError(why_unreachable(run_dir, profile, path, exc)) from None
    except LineClosedError:
        raise LinkError("the router closed the connection before answering initialize") from None


read_body = result_body  # the one reader of a result's body (reconciler/wire/results.py)


def outcome_of(result: Mapping[str, Any], body: Mapping[str, Any]) -> str:
    """'executed', 'pending', 'blocked', or the error code of an error result."""
    meta = result.get("_meta")
    status = meta.get(STATUS) if isinstance(meta, dict) else None
    if not result.get("isError"):
        return "executed"
    if status in ("pending", "blocked") or body.get("status") in ("pending", "blocked"):
        return str(status if status in ("pending", "blocked") else body["status"])
    return str(body.get("error") or "unavailable")


def render_text(value: Any) -> str:
    """What `--format text` prints of an output: its `text` fields in order, else the JSON, indented.

    An object's own `text` stands for everything under it (an OCR page's text already holds its blocks'
    text), and the items of a `pages` list are printed under a line naming each page.
    """
    texts = list(_texts(value))
    if texts:
        return "\n".join(texts)
    return json.dumps(value, indent=2, ensure_ascii=False)


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            yield value["text"]
            return
        for key, item in value.items():
            if key == "pages" and isinstance(item, list) and len(item) > 1:
                for number, page in enumerate(item, 1):
                    yield f"── page {number} of {len(item)} ──"
                    yield from _texts(page)
            else:
                yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def run_call(words: Sequence[str]) -> int:
    """`handler call` on the words after `call`; the exit code."""
    base = argparse.ArgumentParser(prog="handler call", add_help=False, usage=_USAGE, description=_DESCRIPTION)
    _add_own_options(base)
    first, _ = base.parse_known_args(words)
    if not first.interface:
        base.print_help(sys.stdout if first.help else sys.stderr)
        return EXIT_EXECUTED if first.help else EXIT_INVALID
    try:
        meta = caller_of(first.profile, first.interface)
    except ValueError as exc:
        if not first.help:  # --help lists the tools offline without either
            print(f"handler call: {exc}", file=sys.stderr)
            return EXIT_INVALID
        meta = None
    try:
        link = _link(first, meta) if meta is not None else None
    except (LinkError, RemoteLinkError) as exc:
        if not first.help:
            print(f"handler call: {exc}", file=sys.stderr)
            return EXIT_FAILED
        link = None
    except JsonRpcError as exc:  # the profile does not use the interface, or a protocol failure
        print(f"handler call: {exc.message}", file=sys.stderr)
        return EXIT_INVALID if exc.code == INVALID_PARAMS else EXIT_FAILED
    try:
        return _run_with(link, first, words)
    except (LinkError, RemoteLinkError) as exc:
        print(f"handler call: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if link is not None:
            link.close()


def _link(first: argparse.Namespace, meta: Mapping[str, str]) -> RouterLink | RemoteLink:
    """The profile's socket, or with --url its MCP endpoint over HTTP (the token from --token or $HANDLER_TOKEN)."""
    if first.url is None:
        return connect(first.profile, first.run_dir, meta, "handler-call")
    if not first.token:
        raise RemoteLinkError("--url needs a token of the profile: --token, or $HANDLER_TOKEN (handler token "
                              "create PROFILE makes one)")
    return RemoteLink(first.url, first.profile, first.token, meta, "handler-call")


_USAGE = ("handler call INTERFACE [TOOL] --profile P [--url URL --token T] [--FIELD VALUE ...] [--json '{...}'] "
          "[--format json|text]")
_DESCRIPTION = ("Call one tool through the profile's socket, as an agent would. `handler call INTERFACE --help` "
                "lists the interface's tools; `handler call INTERFACE TOOL --help` its fields.")


def _add_own_options(parser: argparse.ArgumentParser, *, with_help: bool = True) -> None:
    parser.add_argument("interface", nargs="?", type=carried_text, help="the interface, e.g. ocr (or ocr/v1; "
                        "'handler' for the built-ins)" if with_help else argparse.SUPPRESS)
    parser.add_argument("tool", nargs="?", type=carried_text,
                        help="the tool to call, e.g. ocr_extract" if with_help else argparse.SUPPRESS)
    parser.add_argument("--profile", default=os.environ.get("HANDLER_PROFILE"),
                        help="the profile whose socket to use (default: $HANDLER_PROFILE)")
    parser.add_argument("--json", metavar="'{...}'", help="arguments as one JSON object ('-': read it from stdin); "
                        "flags add to it")
    parser.add_argument("--format", choices=["text", "json"], default="text",
                        help="text: the output's text fields, else its JSON (default); json: the JSON body")
    parser.add_argument("--run-dir", type=folder_path, help="the router's run folder (default: $HANDLER_RUN_DIR, else "
                        "$XDG_RUNTIME_DIR/handler, else /tmp/handler-$UID)")
    parser.add_argument("--url", default=None, help="call a router elsewhere through the profile's MCP endpoint "
                        "over HTTP (URL/mcp/PROFILE): a handler-file flag's local file is uploaded first, and each "
                        "handler-output-file is downloaded to the path given")
    parser.add_argument("--token", default=os.environ.get("HANDLER_TOKEN"), help="with --url: the profile's bearer "
                        "token (default: $HANDLER_TOKEN, which keeps it out of the process list)")
    parser.add_argument("--root", default=os.environ.get("HANDLER_ROOT") or ".", metavar="DIR",
                        help="the config tree whose tools.json describe the tools when no router answers (default: "
                        "$HANDLER_ROOT, else the current folder)")
    if with_help:
        parser.add_argument("-h", "--help", action="store_true", help="show the tools, or the tool's fields")


def _run_with(link: RouterLink | RemoteLink | None, first: argparse.Namespace, words: Sequence[str]) -> int:
    tools = _list_tools(link, first)
    if tools is None:
        return EXIT_INVALID
    if not first.tool:
        print(_render_listing(first.interface, tools), file=sys.stdout if first.help else sys.stderr)
        return EXIT_EXECUTED if first.help else EXIT_INVALID
    tool = next((t for t in tools if t.get("name") == first.tool), None)
    if tool is None:
        known = ", ".join(str(t.get("name")) for t in tools) or "none"
        print(f"handler call: interface '{first.interface}' has no tool '{first.tool}'; its tools: {known}",
              file=sys.stderr)
        return EXIT_INVALID
    parser = argparse.ArgumentParser(prog=f"handler call {first.interface} {first.tool}",
                                     description=str(tool.get("description") or ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_own_options(parser, with_help=False)
    plans = plan_flags(tool.get("inputSchema") or {}, _OWN)
    add_field_flags(parser, plans)
    try:
        args = parser.parse_args(words)
        arguments = collect_arguments(args, plans, _given_json(args.json))
    except SystemExit as exc:
        return int(exc.code or 0)
    except ValueError as exc:
        print(f"handler call: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if link is None:
        raise LinkError(f"no router serves profile '{first.profile}'")
    return (_call_remote(link, first.tool, tool, arguments, args.format) if isinstance(link, RemoteLink)
            else _call_local(link, first, tool, arguments, args))


def _call_local(link: RouterLink, first: argparse.Namespace, tool: Mapping[str, Any], arguments: dict[str, Any],
                args: argparse.Namespace) -> int:
    """The call on this machine's socket; a file not found in the work folder is told where that folder is."""
    code = _call_and_report(link, first.tool, arguments, args.format)
    if code == EXIT_INVALID and _names_files(tool, arguments):
        _print_work_folder(args.root, first.profile)
    return code


def _names_files(tool: Mapping[str, Any], arguments: Mapping[str, Any]) -> bool:
    """Whether the call gave a value to a `handler-file` field of the tool's top level."""
    fields = (tool.get("inputSchema") or {}).get("properties") or {}
    return any(isinstance(fields.get(name), dict) and fields[name].get("format") == "handler-file"
               for name in arguments)


def _print_work_folder(root: str, profile: str) -> None:
    """Where the profile's files are looked for, as the tree at `root` says, so a person can put the file there."""
    try:
        snapshot = load_tree(root)
    except HandlerError:  # a hint only: a tree that does not load says nothing more
        return
    selected = snapshot.profiles.get(profile)
    if selected is None:
        return
    scope = Path(selected.spec.scope).expanduser()
    folder = scope if scope.is_absolute() else Path(root).absolute() / scope
    print(f"handler call: file paths are relative to the work folder of profile '{profile}': {folder} "
          f"(from the tree at {Path(root).absolute()}; copy the file there, or name it by its path inside)",
          file=sys.stderr)


def _call_remote(link: RemoteLink, name: str, tool: Mapping[str, Any], arguments: dict[str, Any], fmt: str) -> int:
    """The call over HTTP, its input files uploaded first and its outputs downloaded after; what it put in the
    profile's work folder is removed again, but for a held call's, which its run reads once approved."""
    code = EXIT_FAILED
    try:
        arguments = link.files.upload_inputs(tool.get("inputSchema") or {}, arguments)
        code = _call_and_report(link, name, arguments, fmt)
        if code == EXIT_EXECUTED:
            for path in link.files.download_outputs():
                print(f"handler call: wrote {path}", file=sys.stderr)
        return code
    finally:
        if link.files.placed and code != EXIT_PENDING:
            for left in link.files.clear():
                print(f"handler call: could not remove {left} from the work folder", file=sys.stderr)


_JSON_EXAMPLE = """--json '{"path": "a.pdf"}'"""


def _given_json(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    # From stdin the bytes themselves: json decodes them as UTF-8 and says where they are not.
    given = sys.stdin.buffer.read() if text == "-" else text
    try:
        value = json.loads(given)
    except ValueError as exc:
        raise ValueError(f"--json is not JSON ({exc}); give one object, e.g. {_JSON_EXAMPLE}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--json must be one JSON object of the tool's fields, e.g. {_JSON_EXAMPLE}")  # noqa: TRY004
    return value


def _list_tools(link: RouterLink | RemoteLink | None, first: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The interface's tools as the router serves them, else from the config tree; None after an error."""
    if link is not None:
        try:
            return link.list_tools()
        except JsonRpcError as exc:
            print(f"handler call: {exc.message}", file=sys.stderr)
            return None
    return _tree_tools(first.root, first.interface, first.profile)


def _tree_tools(root: str, interface: str, profile: str | None) -> list[dict[str, Any]] | None:
    """The tools of `interface` in the config tree at `root`: the profile's version, else the newest."""
    # Loaded only here, when no router answers: a call through the router needs none of the config room.
    from reconciler.router.builtins import BUILTIN_INTERFACE, BUILTIN_TOOLS

    if interface == BUILTIN_INTERFACE:
        return [t.model_dump(mode="json", exclude_none=True, by_alias=True) for t in BUILTIN_TOOLS]
    snapshot = load_tree(root)
    name, _, pinned = interface.partition("/")
    selected = snapshot.profiles.get(profile or "")
    selection = selected.selections.get(name) if selected else None
    keys = [selection.key] if selection and not pinned else [
        k for k, v in snapshot.interfaces.items() if v.name == name and (not pinned or k == interface)]
    if not keys:
        known = ", ".join(sorted({v.name for v in snapshot.interfaces.values()})) or "none"
        print(f"handler call: no interface '{interface}' in {root} (interfaces: {known})", file=sys.stderr)
        return None
    iface = max((snapshot.interfaces[k] for k in keys), key=lambda v: v.version)
    return [t.model_dump(mode="json", exclude_none=True, by_alias=True) for t in iface.tools]


def _render_listing(interface: str, tools: list[dict[str, Any]]) -> str:
    lines = [f"usage: handler call {interface} TOOL --profile P [--FIELD VALUE ...]", "", f"tools of {interface}:"]
    for tool in tools:
        lines.append(f"  {tool.get('name')}")
        description = str(tool.get("description") or "").strip()
        if description:
            lines.append(f"      {description}")
    lines.append("")
    lines.append(f"`handler call {interface} TOOL --help` shows a tool's fields.")
    return "\n".join(lines)


def _call_and_report(link: RouterLink | RemoteLink, tool: str, arguments: Mapping[str, Any], fmt: str) -> int:
    try:
        result = link.call_tool(tool, arguments)
    except JsonRpcError as exc:
        print(f"handler call: the router refused the call: {exc.message} ({exc.code})", file=sys.stderr)
        return EXIT_INVALID if exc.code == INVALID_PARAMS else EXIT_FAILED
    body = read_body(result)
    outcome = outcome_of(result, body)
    if fmt == "json":
        print(json.dumps(body, ensure_ascii=False))
    if outcome == "executed" and tool == "handler_status":
        return _report_hold(body, fmt)
    if outcome == "executed":
        if fmt == "text":
            print(render_text(body))
        return EXIT_EXECUTED
    message = body.get("message", "")
    if outcome == "pending":
        if fmt == "text":
            print(body.get("request_id", ""))
        print(f"handler call: held for approval as {body.get('request_id')}: {message}", file=sys.stderr)
        return EXIT_PENDING
    print(f"handler call: {outcome}: {message}{_why(result)}", file=sys.stderr)
    if outcome == "blocked":
        return EXIT_BLOCKED
    return EXIT_INVALID if outcome == "invalid_arguments" else EXIT_ERROR


def _why(result: Mapping[str, Any]) -> str:
    """The router's cause of a failed call and whether retrying can help, as the result's `_meta` says them; what
    a binding that is not set up lacks is the owners' to read, in `handler status`."""
    meta = result.get("_meta")
    if not isinstance(meta, Mapping):
        return ""
    said = [f"{key} {meta[name]}" for key, name in (("cause", CAUSE), ("retry", RETRY))
            if isinstance(meta.get(name), str)]
    if meta.get(CAUSE) == "not_set_up":
        said.append("`handler status` names what is missing")
    return f" ({'; '.join(said)})" if said else ""


def _report_hold(body: Mapping[str, Any], fmt: str) -> int:
    """A polled hold: its result once it ran, else its status on stderr; the exit code its status means."""
    status = str(body.get("status") or "unknown")
    if status == "executed":
        if fmt == "text":
            print(render_text(body.get("result") or {}))
    else:
        print(f"handler call: the held call is {status}: {body.get('message', '')}", file=sys.stderr)
    return _HOLD_EXITS.get(status, EXIT_ERROR)
