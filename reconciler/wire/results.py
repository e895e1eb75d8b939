"""Reading a `CallToolResult` the router sent back: its body, whatever the outcome (docs/router.md "Tool results").

An executed result's body is its `structuredContent`; an error, a hold or a refusal carries no
`structuredContent` (so that every client accepts it) and its first text block is the JSON body. The
router's `outcomes` module writes these shapes; `handler-llm`, the conformance harness and any
other client of the router read them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["result_body"]


def result_body(result: Mapping[str, Any]) -> dict[str, Any]:
    """The body of `result`: the output when executed, else the error, pending or blocked body.

    A text that is not a JSON object (a server other than the router) is returned as
    `{"message": text}`, with `"error": "unavailable"` when the result is an error.
    """
    structured = result.get("structuredContent")
    if isinstance(structured, dict) and not result.get("isError"):
        return structured
    text = _first_text(result.get("content"))
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        return body
    if isinstance(structured, dict):  # an error shaped the old way, with its body in structuredContent
        return structured
    return {"error": "unavailable", "message": text} if result.get("isError") else {"message": text}


def _first_text(content: Any) -> str:
    if isinstance(content, list):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
                return str(block["text"])
    return ""
