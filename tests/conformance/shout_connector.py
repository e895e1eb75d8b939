"""A tiny stdio MCP connector for the conformance runner's tests: good, or broken on purpose.

It implements the test interface `shout/v1` (see `shout_tree.py`). Its binding's `mode` setting
(env SHOUT_MODE) chooses how it behaves:

- `good`: upper-cases the text; `empty_text` for an empty one; reads files for `shout_file`;
- `extra_field`: every output carries a field the outputSchema does not allow;
- `bad_code`: a text over 20 characters gets the error `too_long`, outside the closed list;
- `crash_non_ascii`: the process dies on a text with a non-ASCII character;
- `hang_long`: a text over 40 characters never gets an answer.

With SHOUT_COUNT set to "yes", it writes a line `received: ARGUMENTS` to its stderr per tools/call it
receives (the router logs it as the connector's), so a test can count what reached it. Every tool but
`shout_file` is a text tool (the benchmark's interface has many). No SDK: it starts fast, so the tests and the
benchmark measure the runner.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

MODE = os.environ.get("SHOUT_MODE", "good")
COUNT = os.environ.get("SHOUT_COUNT", "") == "yes"
_lock = threading.Lock()


def send(message: dict[str, Any]) -> None:
    data = json.dumps(message) + "\n"
    with _lock:
        sys.stdout.write(data)
        sys.stdout.flush()


def result(msg_id: Any, structured: dict[str, Any], is_error: bool = False) -> None:
    send({"jsonrpc": "2.0", "id": msg_id, "result": {
        "content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured,
        "isError": is_error}})


def shout(msg_id: Any, args: dict[str, Any]) -> None:
    text = args.get("text", "")
    if MODE == "crash_non_ascii" and any(ord(c) > 127 for c in text):
        os._exit(3)
    if MODE == "hang_long" and len(text) > 40:
        return  # never answered; the reader thread goes on, so the process still exits on EOF
    if MODE == "bad_code" and len(text) > 20:
        result(msg_id, {"error": "too_long", "message": "that is a lot of text"}, is_error=True)
        return
    if text == "":
        result(msg_id, {"error": "empty_text", "message": "there was nothing to shout"}, is_error=True)
        return
    out = {"text": text.upper() * int(args.get("times", 1)), "length": len(text)}
    if MODE == "extra_field":
        out["debug"] = "left in by mistake"
    result(msg_id, out)


def shout_file(msg_id: Any, args: dict[str, Any]) -> None:
    data = Path(args["path"]).read_bytes()
    out = {"text": data.decode("utf-8", errors="replace").upper(), "length": len(data)}
    if MODE == "extra_field":
        out["debug"] = "left in by mistake"
    result(msg_id, out)


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        method, msg_id = msg.get("method"), msg.get("id")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": msg_id, "result": {
                "protocolVersion": msg["params"].get("protocolVersion", "2025-11-25"), "capabilities": {"tools": {}},
                "serverInfo": {"name": "shout", "version": "1"}}})
        elif method == "tools/call":
            params = msg["params"]
            if COUNT:
                print("received:", json.dumps(params.get("arguments")), file=sys.stderr, flush=True)
            # Any other tool name is a text tool: the benchmark's interface has many of them.
            handler = shout_file if params.get("name") == "shout_file" else shout
            handler(msg_id, params.get("arguments") or {})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": msg_id, "result": {}})
        elif msg_id is not None and method is not None:
            send({"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
