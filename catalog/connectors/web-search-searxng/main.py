"""web-search-searxng: the web-search/v1 connector on a self-hosted SearXNG instance, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `web_search_query`. Each call is a GET
of the instance's `/search` with `q`, `format=json`, the category `general` and the binding's language,
safesearch level and engines; the answer's `results[]` become the interface's `results` (title, url,
snippet from `content`). SearXNG has no result count: when the first page holds fewer results than asked,
the second page is read too (maxResults is at most 20).

Failures map onto web-search/v1's closed list: HTTP 429 (SearXNG's limiter) is `limit`, with Retry-After
when sent; an answer with no result because every engine was suspended for too many requests or a
CAPTCHA is `limit` too. A refused login, a 403 (JSON output not enabled in the instance's
`search.formats`), a timeout, a 5xx, an answer that is not the expected JSON, or no result because the
engines failed are `unavailable`. The instance's own wording never reaches the result.

Settings (environment): SEARXNG_URL (the instance's base URL, required), SEARXNG_LANGUAGE,
SEARXNG_SAFESEARCH (off, moderate or strict), SEARXNG_ENGINES (comma-separated), SEARXNG_USERNAME and the
secret SEARXNG_PASSWORD (HTTP Basic, for an instance behind a reverse proxy that asks for a login).
Outbound traffic goes through the proxy the router sets in the environment (httpx honours it).
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
from urllib.parse import urlsplit

import anyio
import httpx
from handler_kit.search import MAX_FIELD, clean, is_web_url, retry_after, web_search_query
from handler_kit import Handler, InterfaceError, Reply, needs_a_person, serve

log = logging.getLogger("web-search-searxng")

SEARCH_PATH = "/search"
TIMEOUT_SECONDS = 12.0  # per page; two pages stay under web-search/v1's 30-second call limit
MAX_BODY = 4 * 1024 * 1024  # bytes read from an answer at most; a page of results is tens of KiB
_SAFESEARCH = {"off": "0", "moderate": "1", "strict": "2"}
_LANGUAGE = re.compile(r"^(all|auto|[a-z]{2,3}(-[A-Za-z]{2,4})?)$")
_ENGINE = re.compile(r"^[a-z0-9 _.-]{1,40}$")
# Why SearXNG lists an engine as unresponsive, when waiting is what helps: the engine was rate limited.
_THROTTLED = ("too many requests", "captcha")


def check_base_url(value: str) -> str | None:
    """Why SEARXNG_URL cannot be used, or None: an http(s) address without a login, query or fragment."""
    if not value:
        return "SEARXNG_URL is not set; the binding must name the instance, e.g. https://search.example.org"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"SEARXNG_URL must be an http:// or https:// address, e.g. https://search.example.org (got {value!r})"
    if parts.username or parts.password or parts.query or parts.fragment:
        return ("SEARXNG_URL must not hold a login, a query or a fragment; put the login in SEARXNG_USERNAME "
                "and the secret SEARXNG_PASSWORD")
    return None


@dataclass(frozen=True)
class Settings:
    base_url: str
    language: str | None = None
    safesearch: str = "moderate"
    engines: str | None = None
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> Settings:
        language = env.get("SEARXNG_LANGUAGE", "").strip()
        safesearch = env.get("SEARXNG_SAFESEARCH", "").strip().lower()
        engines = [e.strip().lower() for e in env.get("SEARXNG_ENGINES", "").split(",") if e.strip()]
        if language and not _LANGUAGE.match(language):
            log.error("SEARXNG_LANGUAGE %r is not a language code such as en or fr-FR; the instance's default "
                      "is used", language)
            language = ""
        if safesearch not in _SAFESEARCH:
            safesearch = "moderate"
        if not all(_ENGINE.match(e) for e in engines):
            log.error("SEARXNG_ENGINES must be engine names separated by commas; the instance's defaults are used")
            engines = []
        return cls(base_url=env.get("SEARXNG_URL", "").strip().rstrip("/"), language=language or None,
                   safesearch=safesearch, engines=",".join(engines) or None,
                   username=env.get("SEARXNG_USERNAME", "").strip() or None,
                   password=env.get("SEARXNG_PASSWORD", "") or None)


def refusal(response: httpx.Response) -> InterfaceError:
    """The interface error for an answer that is not 200, from its status and headers only."""
    status = response.status_code
    if status == 401:
        return needs_a_person("the search instance refused the login (HTTP 401); the binding's username or password "
                              "is wrong or missing, and an administrator must fix it")
    if status == 403:
        return needs_a_person("the search instance refused the request (HTTP 403); its operator must allow JSON "
                              "output (search.formats) and this connector's address")
    if status == 429:
        wait = retry_after(response.headers.get("retry-after"))
        after = f"; retry after {wait} seconds" if wait is not None else "; wait a moment before searching again"
        return InterfaceError("limit", f"the search instance's rate limit was reached{after}")
    if status >= 500:
        return InterfaceError("unavailable", f"the search instance is failing (HTTP {status}); retrying later "
                              "may work")
    return needs_a_person(f"the search instance did not accept the request (HTTP {status}); an administrator must "
                          "check the binding")


def page_items(answer: Any) -> list[Any]:
    """The `results` list of a SearXNG answer; anything else is `unavailable`."""
    items = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        raise InterfaceError("unavailable", "the search instance answered something that is not a search result")
    return items


def engines_failed(answer: dict[str, Any]) -> InterfaceError | None:
    """No result and engines listed as unresponsive: the engines failed, which is not 'nothing matched'."""
    failed = answer.get("unresponsive_engines")
    if not isinstance(failed, list) or not failed:
        return None
    reasons = [str(entry[1]).lower() for entry in failed if isinstance(entry, list) and len(entry) > 1]
    if reasons and all(any(word in reason for word in _THROTTLED) for reason in reasons):
        return InterfaceError("limit", f"the search engines behind the instance are rate limiting it "
                              f"({len(failed)} suspended); wait before searching again")
    return InterfaceError("unavailable", f"the search engines behind the instance did not answer ({len(failed)} "
                          "failed); retrying later may work")


def add_results(items: list[Any], results: list[dict[str, str]], limit: int) -> None:
    """Append web-search/v1 results from SearXNG items; an item without a usable address, or seen, is skipped."""
    seen = {r["url"] for r in results}
    for item in items:
        if len(results) >= limit:
            return
        if not isinstance(item, dict) or not is_web_url(item.get("url")) or item["url"] in seen:
            continue
        seen.add(item["url"])
        title = clean(item.get("title")) or item["url"][:MAX_FIELD]
        results.append({"title": title, "url": item["url"], "snippet": clean(item.get("content"))})


async def read_bounded(response: httpx.Response) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_BODY:
            raise InterfaceError("unavailable", "the search instance's answer was far larger than a page of "
                                 "results")
    return bytes(body)


def request_params(query: str, page: int, settings: Settings) -> dict[str, str]:
    params = {"q": query, "format": "json", "categories": "general", "pageno": str(page),
              "safesearch": _SAFESEARCH[settings.safesearch]}
    if settings.language:
        params["language"] = settings.language
    if settings.engines:
        params["engines"] = settings.engines
    return params


async def fetch_page(client: httpx.AsyncClient, query: str, page: int, settings: Settings) -> dict[str, Any]:
    """One page of SearXNG's JSON answer, or an InterfaceError."""
    try:
        with anyio.fail_after(TIMEOUT_SECONDS + 2):
            async with client.stream("GET", settings.base_url + SEARCH_PATH,
                                     params=request_params(query, page, settings)) as response:
                if response.status_code != 200:
                    raise refusal(response)
                body = await read_bounded(response)
    except (TimeoutError, httpx.TimeoutException):
        raise InterfaceError("unavailable", "the search instance did not answer in time; retrying later may "
                             "work") from None
    except httpx.HTTPError as exc:
        log.warning("request to the search instance failed: %s", type(exc).__name__)
        raise InterfaceError("unavailable", "the search instance could not be reached; retrying later may "
                             "work") from None
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        raise InterfaceError("unavailable", "the search instance answered something that is not JSON") from None
    if not isinstance(answer, dict):
        raise InterfaceError("unavailable", "the search instance answered something that is not a search result")
    return answer


async def search(query: str, max_results: int, settings: Settings) -> dict[str, Any]:
    """One search: web-search/v1's output, or an InterfaceError."""
    problem = check_base_url(settings.base_url)
    if problem:
        raise needs_a_person("this binding names no usable search instance; " + problem)
    auth = httpx.BasicAuth(settings.username, settings.password or "") if settings.username else None
    results: list[dict[str, str]] = []
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False, auth=auth,
                                 headers={"Accept": "application/json"}) as client:
        for page in (1, 2):
            answer = await fetch_page(client, query, page, settings)
            items = page_items(answer)
            if page == 1 and not items and (failed := engines_failed(answer)):
                raise failed
            add_results(items, results, max_results)
            if len(results) >= max_results or not items:
                break
    return {"results": results}


def main() -> None:
    settings = Settings.from_env(os.environ)
    serve("web-search/v1", "web-search-searxng", {"web_search_query": web_search_query(functools.partial(search, settings=settings))},
          problem=check_base_url(settings.base_url) or "",
          failed="the search failed unexpectedly; retrying later may work")


if __name__ == "__main__":
    main()
