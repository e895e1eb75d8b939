"""The connector kit: an interface's tools served with the official MCP SDK, its closed errors, one main loop.

A connector written on the kit keeps only what is its own (the engine or vendor it talks to, the mapping of
its failures onto the interface's errors) and hands the rest to `serve`:

    from handler_kit import InterfaceError, Reply, serve

    async def web_search_query(args: dict[str, Any]) -> Reply:
        ...  # raise InterfaceError("limit", "...") for a failure of the interface's closed list
        return Reply(output, text)

    serve("web-search/v1", "web-search-brave", {"web_search_query": web_search_query},
          failed="the search failed unexpectedly; retrying later may work")

What `tools/list` answers is the interface's `tools.json`, read where the router shows the interfaces (the
folder `HANDLER_INTERFACES` names; else the `catalog/interfaces` above the connector's folder), never a copy in
the connector; the arguments a handler gets have passed the tool's `inputSchema` (the router checks them too; a
connector run on its own, by any MCP client, checks them here). An error result is `isError` with
`{"error": code, "message": ...}`, the code one of the interface's `[errors]` or `invalid_arguments`, and
`_meta["handler/retry"]` when the connector says whether calling again can help. Where the kit lives and how a
connector's own environment gets it: docs/conformance.md "Writing a connector on the kit". It imports the
standard library and the MCP SDK (with jsonschema, which the SDK requires) only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

__all__ = ["Handler", "Interface", "InterfaceError", "Reply", "build_server", "error_result", "find_interface",
           "log_to_stderr", "needs_a_person", "serve"]

log = logging.getLogger("handler_kit")

INTERFACES_ENV = "HANDLER_INTERFACES"  # the folder of interfaces the router shows a connector
ROUTER_CODES = frozenset({"invalid_arguments"})  # the router's own code, which any connector may send too
RETRY_KEY = "handler/retry"
RETRY_WORDS = frozenset({"later", "never"})


class InterfaceError(Exception):
    """A failure of the interface's closed list: `code` one of its `[errors]`, `message` what the model reads
    (what happened and what to do next); `retry` ("later" or "never") when the connector knows better than the
    code whether calling again can help."""

    def __init__(self, code: str, message: str, retry: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry = retry if retry in RETRY_WORDS else None


def needs_a_person(message: str) -> InterfaceError:
    """`unavailable` that no retry cures until a person acts (installs the engine, fixes the binding, its key or its
    account): `message` says what is wrong and who must act; the model is told to do without and tell the user, and
    `handler/retry` is `never` (docs/router.md, "Retrying")."""
    return InterfaceError("unavailable", f"{message}; calling again will not help until then, so do without this "
                          "service for now and tell the user", retry="never")


@dataclass(frozen=True)
class Reply:
    """A tool's answer: its structured output (the interface's outputSchema) and the text beside it."""

    output: dict[str, Any]
    text: str


Handler = Callable[[dict[str, Any]], Awaitable[Reply]]


@dataclass(frozen=True)
class Interface:
    """One interface version as the connector sees it: its tools, verbatim, and its closed error codes."""

    key: str
    tools: tuple[types.Tool, ...]
    errors: frozenset[str]

    @classmethod
    def read(cls, key: str, folder: Path) -> Interface:
        """The interface in `folder` (its tools.json and interface.toml)."""
        listed = json.loads((folder / "tools.json").read_text(encoding="utf-8"))
        declared = tomllib.loads((folder / "interface.toml").read_text(encoding="utf-8")).get("errors") or {}
        return cls(key, tuple(types.Tool.model_validate(tool) for tool in listed), frozenset(declared))

    def tool_names(self) -> frozenset[str]:
        return frozenset(tool.name for tool in self.tools)

    def checkers(self) -> dict[str, jsonschema.protocols.Validator]:
        """Each tool's `inputSchema` as a validator (its own `$schema`'s draft, 2020-12 by default)."""
        found = {}
        for tool in self.tools:
            cls = jsonschema.validators.validator_for(tool.input_schema, default=jsonschema.Draft202012Validator)
            found[tool.name] = cls(tool.input_schema)
        return found


def check_arguments(tool: str, checker: jsonschema.protocols.Validator, args: dict[str, Any]) -> None:
    """Raise `invalid_arguments` naming the first field of `args` that breaks the tool's `inputSchema` and the rule
    it breaks (never the value: it may be long or private)."""
    error = next(iter(checker.iter_errors(args)), None)
    if error is None:
        return
    where = "/".join(str(p) for p in error.absolute_path) or "the arguments"
    if error.validator in ("required", "additionalProperties"):  # these messages name properties, not values
        rule = error.message[:200]
    else:
        rule = f"the inputSchema's {error.validator} {json.dumps(error.validator_value)[:200]}"
    raise InterfaceError("invalid_arguments", f"{tool}: {where} breaks {rule}; fix that argument and call again",
                         "never")


def find_interface(key: str, near: Path | None = None) -> Interface:
    """The interface `key` ("name/vN"): in the folder `HANDLER_INTERFACES` names, else in the first
    `catalog/interfaces` above `near` (the connector's folder; the running script's by default) or the working
    folder. Raises `LookupError` saying where it looked."""
    name, _, version = key.partition("/")
    if not name or not version.startswith("v") or not version[1:].isdigit():
        raise LookupError(f"'{key}' is not an interface version; name one as name/vN, e.g. web-search/v1")
    roots = [Path(os.environ[INTERFACES_ENV])] if os.environ.get(INTERFACES_ENV) else []
    here = (near or Path(sys.argv[0] or ".")).resolve()
    for start in (here if here.is_dir() else here.parent, Path.cwd().resolve()):
        roots += [above / "catalog" / "interfaces" for above in (start, *start.parents)]
    for root in roots:
        if (root / name / version / "tools.json").is_file():
            return Interface.read(key, root / name / version)
    raise LookupError(f"the interface {key} was not found (looked in {INTERFACES_ENV} and in catalog/interfaces "
                      "above the connector's folder); run the connector from its config tree, or set "
                      f"{INTERFACES_ENV} to the folder holding {name}/{version}/tools.json")


def error_result(code: str, message: str, retry: str | None = None) -> types.CallToolResult:
    """The interface error result the router reads: `isError`, `{"error", "message"}`, and `handler/retry` when
    the connector says whether calling again can help."""
    meta = {RETRY_KEY: retry} if retry in RETRY_WORDS else None
    return types.CallToolResult(content=[types.TextContent(text=message)],
                                structured_content={"error": code, "message": message}, is_error=True, _meta=meta)


def build_server(interface: Interface, name: str, handlers: Mapping[str, Handler], *, failed: str,
                 version: str = "1.0.0") -> Server[Any]:
    """The MCP server of a connector: `tools/list` is the interface's tools, `tools/call` runs the handler of the
    tool named and turns an `InterfaceError` into the error result (an unexpected exception into `unavailable`
    with the message `failed`). Raises `ValueError` when `handlers` and the interface's tools differ."""
    if set(handlers) != interface.tool_names():
        raise ValueError(f"{name} answers {sorted(handlers)} but {interface.key} has the tools "
                         f"{sorted(interface.tool_names())}; give one handler per tool of the interface")
    closed = interface.errors | ROUTER_CODES
    checkers = interface.checkers()

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(interface.tools))

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        handler = handlers.get(params.name)
        if handler is None:
            return error_result("unavailable", f"this connector has no tool '{params.name[:100]}'; call one of "
                                f"{', '.join(sorted(handlers))}")
        try:
            args = dict(params.arguments or {})
            check_arguments(params.name, checkers[params.name], args)
            reply = await handler(args)
        except InterfaceError as exc:
            if exc.code not in closed:
                log.error("%s raised '%s', which %s does not declare; sent as unavailable", params.name, exc.code,
                          interface.key)
                return error_result("unavailable", exc.message, exc.retry)
            return error_result(exc.code, exc.message, exc.retry)
        except Exception:
            log.exception("%s failed", params.name)
            return error_result("unavailable", failed)
        return types.CallToolResult(content=[types.TextContent(text=reply.text)], structured_content=reply.output)

    return Server(name, version=version, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(server: Server[Any], start: Callable[[], Awaitable[None]] | None = None) -> None:
    """Serve `server` on stdin and stdout until the router closes them, after `start` (what the connector readies
    before the router's `initialize` is answered: an engine it checks, a model it loads)."""
    if start is not None:
        await start()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def log_to_stderr() -> None:
    """The connector's log on stderr, which the router keeps (masked, bounded); `serve` calls it too."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


def serve(interface: str, name: str, handlers: Mapping[str, Handler], *, failed: str,
          start: Callable[[], Awaitable[None]] | None = None, problem: str = "", near: Path | None = None) -> None:
    """A connector's main loop: log to stderr, find `interface`, run `start`, then serve `handlers` over stdio
    until the router closes them. `failed` is what the model reads when a handler fails unexpectedly; `problem`,
    what is wrong with the binding's settings (logged once: its calls say it too)."""
    log_to_stderr()
    if problem:
        log.error("%s; every call will fail until the binding is fixed", problem)
    found = find_interface(interface, near)
    anyio.run(serve_stdio, build_server(found, name, handlers, failed=failed), start)
