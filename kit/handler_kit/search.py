"""web-search/v1's side of a search vendor: the tool's handler, a result's fields as the interface bounds them, and
the header a rate limit names its wait in. What each vendor's answer means stays in its connector."""

from __future__ import annotations

import html
import re
from collections.abc import Awaitable, Callable
from typing import Any

from handler_kit import Handler, InterfaceError, Reply

__all__ = ["DEFAULT_RESULTS", "MAX_FIELD", "Search", "clean", "is_web_url", "retry_after", "web_search_query"]

MAX_FIELD = 2000  # characters kept of a title or a snippet
DEFAULT_RESULTS = 10  # web-search/v1: when maxResults is omitted
Search = Callable[[str, int], Awaitable[dict[str, Any]]]  # (query, how many) -> web-search/v1's output
_URL = re.compile(r"^https?://[^\s/?#]+\S*$")
_TAG = re.compile(r"<[^>]{0,200}>")  # vendors mark the query's words in snippets (<strong>, <b>)


def clean(value: Any) -> str:
    """A text field of a result: tags and entities removed, bounded; anything not a string is empty."""
    if not isinstance(value, str):
        return ""
    return html.unescape(_TAG.sub("", value[: MAX_FIELD * 2])).strip()[:MAX_FIELD]


def is_web_url(value: Any) -> bool:
    """An absolute http(s) address with no spaces or control characters: what a result's `url` may be."""
    return (isinstance(value, str) and len(value) <= 4096 and _URL.match(value) is not None
            and not any(ord(c) < 32 or ord(c) == 127 for c in value))


def retry_after(value: str | None) -> int | None:
    """Whole seconds from a Retry-After header given in seconds (an HTTP date is ignored)."""
    if value and value.strip().isdigit():
        return min(int(value.strip()), 86400)
    return None


def web_search_query(search: Search) -> Handler:
    """The `web_search_query` tool on a vendor's `search`: the query checked, the results as the model reads them."""

    async def handle(args: dict[str, Any]) -> Reply:
        query, count = args["query"], args.get("maxResults", DEFAULT_RESULTS)
        if not query.strip():
            raise InterfaceError("invalid_arguments", "query is only spaces; say what to search for")
        output = await search(query, count)
        text = "\n\n".join(f"{r['title']}\n{r['url']}\n{r['snippet']}".strip() for r in output["results"])
        return Reply(output, text or "no results")

    return handle
