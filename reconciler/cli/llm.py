"""`handler-llm`: `handler call llm llm_chat` (or `llm_complete`) for a prompt, with the llm shortcuts (docs/router.md).

A thin alias of `handler call` (`reconciler.cli.call`): the same link to the calling profile's socket,
the same `_meta`, the same reading of results, so the profile's selection, limits and governance
apply exactly as to an agent. What it adds is the prompt: taken from the arguments or stdin and sent
as one user message, to whichever version of llm the profile serves (llm/v2's `llm_chat`, offering no tools,
or llm/v1's `llm_complete`); the reply's text goes to stdout. It keeps the exit codes scripts written for it
rely on, one per outcome, so a script can tell a refusal from a rate limit from an outage:

    0 the reply was printed    3 refused     4 limit       5 unavailable
    6 invalid_arguments        7 blocked     8 pending (held for approval; the request id on stderr)
    1 no router or a protocol failure        2 unusable arguments
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from reconciler.cli.call import LinkError, RouterLink, caller_of, connect, outcome_of, read_body
from reconciler.cli.common import folder_path
from reconciler.cli.flags import carried_integer, carried_number, carried_text
from reconciler.wire.errors import JsonRpcError

__all__ = ["EXIT_CODES", "main"]

EXIT_CODES = {"refused": 3, "limit": 4, "unavailable": 5, "invalid_arguments": 6, "blocked": 7, "pending": 8}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="handler-llm", description="Ask the profile's llm service; print the reply.")
    parser.add_argument("prompt", nargs="*", type=carried_text, help="the prompt (default: read from stdin)")
    parser.add_argument("--profile", default=os.environ.get("HANDLER_PROFILE"),
                        help="the profile whose socket to use (default: $HANDLER_PROFILE)")
    parser.add_argument("--system", type=carried_text, help="instructions that frame the conversation")
    parser.add_argument("--max-tokens", type=carried_integer, help="the longest reply allowed, in tokens")
    parser.add_argument("--temperature", type=carried_number, help="sampling temperature, 0 for the most "
                        "deterministic reply (default: the service's)")
    parser.add_argument("--model", type=carried_text, help="a model the service offers (default: the service's)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON, not only the text")
    parser.add_argument("--run-dir", type=folder_path, help="the router's run folder (default: $HANDLER_RUN_DIR)")
    args = parser.parse_args(argv)
    try:
        meta = caller_of(args.profile, "llm")
        prompt = _read_prompt(args.prompt)
    except ValueError as exc:
        print(f"handler-llm: {exc}", file=sys.stderr)
        return 2
    arguments: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]}
    for key, value in (("system", args.system), ("maxTokens", args.max_tokens), ("temperature", args.temperature),
                       ("model", args.model)):
        if value is not None:
            arguments[key] = value
    try:
        with connect(args.profile, args.run_dir, meta, "handler-llm") as link:
            result = _ask(link, arguments)
    except LinkError as exc:
        print(f"handler-llm: {exc}", file=sys.stderr)
        return 1
    except JsonRpcError as exc:
        print(f"handler-llm: the router refused the call: {exc.message} ({exc.code})", file=sys.stderr)
        return 1
    return _report(result, as_json=args.json)


def _ask(link: RouterLink, arguments: dict[str, Any]) -> dict[str, Any]:
    """The v1-shaped `arguments` sent to llm/v2's `llm_chat` when the profile serves it (the system prompt its first
    message), else to llm/v1's `llm_complete`."""
    if not any(tool.get("name") == "llm_chat" for tool in link.list_tools()):
        return link.call_tool("llm_complete", arguments)
    system = arguments.pop("system", None)
    if system:  # llm/v1 ignores an empty one; llm/v2's system message has content
        arguments["messages"] = [{"role": "system", "content": system}, *arguments["messages"]]
    return link.call_tool("llm_chat", arguments)


def _read_prompt(words: list[str]) -> str:
    """The prompt from the arguments, else from stdin; ValueError when it is empty or stdin is not UTF-8."""
    if words and words != ["-"]:
        prompt = " ".join(words)
    else:
        try:
            prompt = sys.stdin.buffer.read().decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"the prompt on stdin is not UTF-8 text ({exc})") from None
    if not prompt.strip():
        raise ValueError("the prompt is empty; give it as arguments or on stdin")
    return prompt


def _report(result: dict[str, Any], *, as_json: bool) -> int:
    content = read_body(result)
    if as_json:
        print(orjson.dumps(result).decode())
    if not result.get("isError"):
        if not as_json:
            sys.stdout.write(content.get("text", ""))
            if not content.get("text", "").endswith("\n"):
                sys.stdout.write("\n")
        return 0
    outcome = outcome_of(result, content)
    message = content.get("message", "")
    if outcome == "pending":
        print(f"handler-llm: held for approval as {content.get('request_id')}: {message}", file=sys.stderr)
    else:
        print(f"handler-llm: {outcome}: {message}", file=sys.stderr)
    return EXIT_CODES.get(outcome, EXIT_CODES["unavailable"])


if __name__ == "__main__":
    sys.exit(main())
