"""web-search-brave: the web-search/v1 connector on the Brave Search API, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `web_search_query`. Each call is one
GET of Brave's web search endpoint (`q`, `count`, and the binding's country and safesearch settings);
the answer's `web.results[]` become the interface's `results` (title, url, snippet from `description`).
Failures map onto web-search/v1's closed list: HTTP 429 is `limit` (with Retry-After when Brave sends
it); a refused key, an exhausted quota, a timeout, a 5xx or an answer that is not the expected JSON are
`unavailable`. Brave's own wording never reaches the result: the messages say what happened in plain words.

Settings (environment): BRAVE_API_KEY (the secret), BRAVE_COUNTRY (two letters, optional),
BRAVE_SAFESEARCH (off, moderate or strict; moderate by default).
"""

from __future__ import annotations

import functools
import html
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from handler_kit.search import MAX_FIELD, clean, is_web_url, retry_after, web_search_query
from handler_kit import Handler, InterfaceError, Reply, needs_a_person, serve

log = logging.getLogger("web-search-brave")

BASE_URL = "https://api.search.brave.com"
SEARCH_PATH = "/res/v1/web/search"
TIMEOUT_SECONDS = 20.0  # under web-search/v1's 30-second call limit
MAX_BODY = 4 * 1024 * 1024  # bytes read from an answer at most; a page of 20 results is tens of KiB
_SAFESEARCH = ("off", "moderate", "strict")
_COUNTRY = re.compile(r"^[A-Za-z]{2}$")


@dataclass(frozen=True)
class Settings:
    api_key: str
    country: str | None = None
    safesearch: str = "moderate"

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> Settings:
        country = env.get("BRAVE_COUNTRY", "").strip()
        safesearch = env.get("BRAVE_SAFESEARCH", "").strip().lower()
        if country and not _COUNTRY.match(country):
            log.error("BRAVE_COUNTRY %r is not a two-letter code; Brave's default is used", country)
            country = ""
        if safesearch not in _SAFESEARCH:
            safesearch = "moderate"
        return cls(api_key=env.get("BRAVE_API_KEY", "").strip(), country=country.upper() or None,
                   safesearch=safesearch)


def quota_exhausted(remaining: str | None) -> bool:
    """Brave's X-RateLimit-Remaining lists the per-second then the monthly allowance: "0, 0" is no quota."""
    parts = [p.strip() for p in (remaining or "").split(",")]
    return len(parts) > 1 and parts[1] == "0"


def refusal(response: httpx.Response) -> InterfaceError:
    """The interface error for an answer that is not 200, from its status and headers only."""
    status = response.status_code
    if status in (401, 403):
        return needs_a_person(f"the search service refused the API key (HTTP {status}); the binding's key is wrong, "
                              "revoked or not subscribed to the Search API, and an administrator must replace it")
    if status == 429 and quota_exhausted(response.headers.get("x-ratelimit-remaining")):
        return needs_a_person("the search service's quota for this key is used up; searching will work again when "
                              "the quota renews or an administrator raises it")
    if status == 429:
        wait = retry_after(response.headers.get("retry-after"))
        after = f"; retry after {wait} seconds" if wait is not None else "; wait a moment before searching again"
        return InterfaceError("limit", f"the search service's rate limit was reached{after}")
    if status >= 500:
        return InterfaceError("unavailable", f"the search service is failing (HTTP {status}); retrying later may "
                              "work")
    return needs_a_person(f"the search service did not accept the request (HTTP {status}); an administrator must "
                          "check the binding")


def results_from(answer: Any, limit: int) -> list[dict[str, str]]:
    """web-search/v1 results from Brave's answer; an item without a usable title and web address is skipped."""
    if not isinstance(answer, dict):
        raise InterfaceError("unavailable", "the search service answered something that is not a search result")
    web = answer.get("web")
    if web is None:  # Brave leaves `web` out when nothing matched
        return []
    items = web.get("results") if isinstance(web, dict) else None
    if not isinstance(items, list):
        raise InterfaceError("unavailable", "the search service answered something that is not a search result")
    results = []
    for item in items:
        if not isinstance(item, dict) or not is_web_url(item.get("url")):
            continue
        title = clean(item.get("title")) or item["url"][:MAX_FIELD]
        results.append({"title": title, "url": item["url"], "snippet": clean(item.get("description"))})
        if len(results) == limit:
            break
    return results


async def read_bounded(response: httpx.Response) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_BODY:
            raise InterfaceError("unavailable", "the search service's answer was far larger than a page of results")
    return bytes(body)


async def search(query: str, max_results: int, settings: Settings) -> dict[str, Any]:
    """One search: web-search/v1's output, or an InterfaceError."""
    if not settings.api_key:
        raise needs_a_person("no Brave Search API key is configured for this binding; an administrator must set one")
    params: dict[str, str | int] = {"q": query, "count": max_results, "safesearch": settings.safesearch}
    if settings.country:
        params["country"] = settings.country
    headers = {"Accept": "application/json", "X-Subscription-Token": settings.api_key}
    try:
        with anyio.fail_after(TIMEOUT_SECONDS + 2):
            async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False) as client, \
                    client.stream("GET", BASE_URL + SEARCH_PATH, params=params, headers=headers) as response:
                if response.status_code != 200:
                    raise refusal(response)
                body = await read_bounded(response)
    except (TimeoutError, httpx.TimeoutException):
        raise InterfaceError("unavailable", "the search service did not answer in time; retrying later may "
                             "work") from None
    except httpx.HTTPError:
        raise InterfaceError("unavailable", "the search service could not be reached; retrying later may "
                             "work") from None
    try:
        answer = json.loads(body)
    except ValueError:
        raise InterfaceError("unavailable", "the search service answered something that is not JSON") from None
    return {"results": results_from(answer, max_results)}


def main() -> None:
    settings = Settings.from_env(os.environ)
    serve("web-search/v1", "web-search-brave", {"web_search_query": web_search_query(functools.partial(search, settings=settings))},
          problem="" if settings.api_key else "BRAVE_API_KEY is not set",
          failed="the search failed unexpectedly; retrying later may work")


if __name__ == "__main__":
    main()
