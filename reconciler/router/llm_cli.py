"""`handler-llm`: the llm/v1 command-line client for scripts (docs/architecture.md §3).

It calls `llm_complete` through the calling profile's socket, exactly as an agent would, so the
profile's selection, limits and governance apply. The prompt comes from the arguments or stdin; the
reply's text goes to stdout. Each outcome has its own exit code, so a script can tell a refusal
from a rate limit from an outage:

    0 the reply was printed    3 refused     4 limit       5 unavailable
    6 invalid_arguments        7 blocked     8 pending (held for approval; the request id on stderr)
    1 no router or a protocol failure        2 unusable arguments
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from reconciler.places import default_run_dir, socket_path
from reconciler.wire.client import LineClient
from reconciler.wire.errors import JsonRpcError, LineClosedError
from reconciler.wire.meta import caller_meta
from reconciler.wire.results import result_body

__all__ = ["EXIT_CODES", "main"]

EXIT_CODES = {"refused": 3, "limit": 4, "unavailable": 5, "invalid_arguments": 6, "blocked": 7, "pending": 8}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="handler-llm", description="Ask the profile's llm service; print the reply.")
    parser.add_argument("prompt", nargs="*", help="the prompt (default: read from stdin)")
    parser.add_argument("--profile", default=os.environ.get("HANDLER_PROFILE"),
                        help="the profile whose socket to use (default: $HANDLER_PROFILE)")
    parser.add_argument("--system", help="instructions that frame the conversation")
    parser.add_argument("--max-tokens", type=int, help="the longest reply allowed, in tokens")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--model", help="a model the service offers (default: the service's)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON, not only the text")
    parser.add_argument("--run-dir", type=Path, help="the router's run folder (default: $HANDLER_RUN_DIR)")
    args = parser.parse_args(argv)
    if not args.profile:
        print("handler-llm: name the profile with --profile or HANDLER_PROFILE", file=sys.stderr)
        return 2
    prompt = " ".join(args.prompt) if args.prompt and args.prompt != ["-"] else sys.stdin.read()
    if not prompt.strip():
        print("handler-llm: the prompt is empty; give it as arguments or on stdin", file=sys.stderr)
        return 2
    arguments: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]}
    for key, value in (("system", args.system), ("maxTokens", args.max_tokens), ("temperature", args.temperature),
                       ("model", args.model)):
        if value is not None:
            arguments[key] = value
    path = socket_path(args.run_dir or default_run_dir(), args.profile)
    try:
        result = _call(path, arguments)
    except OSError as exc:
        print(f"handler-llm: no router serves profile '{args.profile}' at {path} ({exc.strerror or exc}); start "
              "one with `handler up`", file=sys.stderr)
        return 1
    except _ProtocolError as exc:
        print(f"handler-llm: {exc}", file=sys.stderr)
        return 1
    return _report(result, as_json=args.json)


class _ProtocolError(Exception):
    pass


def _call(path: Path, arguments: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(_call_async(path, arguments))


async def _call_async(path: Path, arguments: dict[str, Any]) -> dict[str, Any]:
    meta = caller_meta("llm", os.environ)
    client = await LineClient.connect_unix(path, name="the router")
    method = "initialize"
    try:
        await client.initialize({"name": "handler-llm", "version": "1"}, meta=meta)
        method = "tools/call"
        return await client.request(method, {"name": "llm_complete", "arguments": arguments, "_meta": meta})
    except LineClosedError:
        raise _ProtocolError("the router closed the connection before answering") from None
    except JsonRpcError as exc:
        raise _ProtocolError(f"the router refused {method}: {exc.message} ({exc.code})") from None
    finally:
        client.close()


def _report(result: dict[str, Any], *, as_json: bool) -> int:
    content = result_body(result)
    if as_json:
        print(orjson.dumps(result).decode())
    if not result.get("isError"):
        if not as_json:
            sys.stdout.write(content.get("text", ""))
            if not content.get("text", "").endswith("\n"):
                sys.stdout.write("\n")
        return 0
    outcome = content.get("error") or content.get("status") or "unavailable"
    message = content.get("message", "")
    if outcome == "pending":
        print(f"handler-llm: held for approval as {content.get('request_id')}: {message}", file=sys.stderr)
    else:
        print(f"handler-llm: {outcome}: {message}", file=sys.stderr)
    return EXIT_CODES.get(outcome, EXIT_CODES["unavailable"])
