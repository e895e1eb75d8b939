"""The Brave connector against a loopback stand-in for Brave's API: results mapped onto web-search/v1, every
failure onto its closed list, and the same through the real router.

The stand-in checks what Brave checks (GET on the search path, the subscription token, a `q`) and answers
400 to any other request; the query picks the answer it plays back.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
import pytest

from tests.fixtures.harness import RawClient, body, run, serving, short_dir
from tests.fixtures.loopback import QuietHandler, serving_http

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/web-search-brave/main.py"
TOOL = json.loads((REPO / "catalog/interfaces/web-search/v1/tools.json").read_text())[0]
KEY = "test-subscription-token"
SEARCH_PATH = "/res/v1/web/search"

RESULTS = {"type": "search", "web": {"type": "search", "results": [
    {"title": "The <strong>Rust</strong> Programming Language", "url": "https://doc.rust-lang.org/book/",
     "description": "Learn <strong>Rust</strong> &amp; its ownership model.", "age": "2 days ago"},
    {"title": "no address", "description": "skipped: a result needs a web address"},
    {"title": "Rust (programming language)", "url": "https://en.wikipedia.org/wiki/Rust_(programming_language)"},
    {"title": "script", "url": "javascript:alert(1)", "description": "skipped: not a web address"},
]}}


class StandIn(QuietHandler):
    """Brave's web search endpoint, as far as the connector uses it."""

    seen: list[dict[str, list[str]]] = []  # noqa: RUF012 - the test reads what each request asked

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path != SEARCH_PATH or self.headers.get("X-Subscription-Token") != KEY or not query.get("q"):
            self.send_body(400, b'{"type": "ErrorResponse", "error": {"code": "VALIDATION"}}')
            return
        StandIn.seen.append(query)
        self.answer(query["q"][0])

    def do_POST(self) -> None:
        self.send_body(400, b"GET only")

    def answer(self, q: str) -> None:
        if q == "refused":
            self.send_body(401, b'{"error": {"detail": "SUBSCRIPTION_TOKEN_INVALID internal wording"}}')
        elif q in ("busy", "quota"):
            self.send_response(429)
            self.send_header("Retry-After", "7")
            self.send_header("X-RateLimit-Remaining", "0, 0" if q == "quota" else "0, 1500")
            self.send_header("content-length", "0")
            self.end_headers()
        elif q == "down":
            self.send_body(503, b"Traceback (most recent call last): upstream exploded")
        elif q == "slow":
            time.sleep(1.0)
            self.send_body(200, json.dumps(RESULTS).encode(), "application/json")
        elif q == "garbled":
            self.send_body(200, b"<html>not json</html>", "application/json")
        elif q == "odd":
            self.send_body(200, b'{"web": {"results": "nope"}}', "application/json")
        elif q == "huge":
            self.send_body(200, b'{"web": {"results": [' + b" " * 300_000 + b"]}}", "application/json")
        elif q == "nothing":
            self.send_body(200, b'{"type": "search", "query": {"original": "nothing"}}', "application/json")
        else:
            self.send_body(200, json.dumps(RESULTS).encode(), "application/json")


def load_connector() -> ModuleType:
    spec = importlib.util.spec_from_file_location("web_search_brave_main", CONNECTOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def brave(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The connector module, its base URL pointed at the stand-in."""
    module = load_connector()
    StandIn.seen = []
    with serving_http(StandIn) as url:
        monkeypatch.setattr(module, "BASE_URL", url)
        yield module


def search(module: ModuleType, query: str, count: int = 10, key: str = KEY, **settings: Any) -> dict[str, Any]:
    return asyncio.run(module.search(query, count, module.Settings(api_key=key, **settings)))


def failure(module: ModuleType, query: str, key: str = KEY) -> tuple[str, str]:
    error = raised(module, query, key)
    return error.code, error.message


def raised(module: ModuleType, query: str, key: str = KEY) -> Any:
    """The interface error a search raises: its code, message and `retry`."""
    with pytest.raises(module.InterfaceError) as caught:
        search(module, query, key=key)
    return caught.value


def test_results_map_onto_the_interface_and_validate(brave: ModuleType) -> None:
    output = search(brave, "rust book", count=5, country="FR", safesearch="strict")
    jsonschema.validate(output, TOOL["outputSchema"])
    assert output == {"results": [
        {"title": "The Rust Programming Language", "url": "https://doc.rust-lang.org/book/",
         "snippet": "Learn Rust & its ownership model."},
        {"title": "Rust (programming language)", "url": "https://en.wikipedia.org/wiki/Rust_(programming_language)",
         "snippet": ""},
    ]}
    assert StandIn.seen == [{"q": ["rust book"], "count": ["5"], "safesearch": ["strict"], "country": ["FR"]}]


def test_max_results_cuts_the_list_and_no_match_is_empty(brave: ModuleType) -> None:
    assert [r["title"] for r in search(brave, "rust", count=1)["results"]] == ["The Rust Programming Language"]
    assert search(brave, "nothing") == {"results": []}


@pytest.mark.parametrize(("query", "code", "says", "retry"), [
    ("refused", "unavailable", "refused the API key (HTTP 401)", "never"),  # until a person replaces the key
    ("busy", "limit", "retry after 7 seconds", None),  # the code says it: later
    ("quota", "unavailable", "quota for this key is used up", "never"),
    ("down", "unavailable", "failing (HTTP 503)", None),
    ("garbled", "unavailable", "not JSON", None),
    ("odd", "unavailable", "not a search result", None),
])
def test_each_failure_maps_onto_the_closed_list(brave: ModuleType, query: str, code: str, says: str,
                                                retry: str | None) -> None:
    error = raised(brave, query)
    got, message = error.code, error.message
    assert got == code
    assert says in message
    assert error.retry == retry
    if retry == "never":  # and the model reads what to do instead
        assert "do without this service for now and tell the user" in message
    assert "Traceback" not in message
    assert "SUBSCRIPTION_TOKEN_INVALID" not in message


def test_a_timeout_and_an_oversized_body_are_unavailable(brave: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(brave, "TIMEOUT_SECONDS", 0.2)
    assert failure(brave, "slow") == ("unavailable", "the search service did not answer in time; retrying later "
                                      "may work")
    monkeypatch.setattr(brave, "MAX_BODY", 64 * 1024)
    code, message = failure(brave, "huge")
    assert code == "unavailable"
    assert "far larger" in message


def test_a_request_of_the_wrong_shape_is_refused_by_the_stand_in(brave: ModuleType,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    refused = raised(brave, "rust", key="another-token")
    assert (refused.code, refused.retry) == ("unavailable", "never")
    assert refused.message.startswith("the search service did not accept the request (HTTP 400); an administrator")
    monkeypatch.setattr(brave, "SEARCH_PATH", "/res/v1/news/search")
    assert failure(brave, "rust")[1].startswith("the search service did not accept the request (HTTP 400)")
    assert StandIn.seen == []


def test_no_key_is_unavailable_without_a_request(brave: ModuleType) -> None:
    error = raised(brave, "rust", key="")
    assert (error.code, error.retry) == ("unavailable", "never")
    assert error.message.startswith("no Brave Search API key is configured for this binding; an administrator")
    assert StandIn.seen == []


def test_through_the_router(shipped_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped binding (researcher's web-search) on the real router, the connector's base URL rewritten."""
    monkeypatch.setenv("BRAVE_API_KEY", KEY)
    main = shipped_tree / "catalog/connectors/web-search-brave/main.py"
    with serving_http(StandIn) as url, short_dir() as run_dir:
        main.write_text(main.read_text().replace('BASE_URL = "https://api.search.brave.com"', f'BASE_URL = "{url}"'))
        StandIn.seen = []

        async def scenario() -> None:
            # sandbox=False: the stand-in is on loopback, which the sandbox's network namespace cannot reach.
            async with serving(shipped_tree, run_dir, sandbox=False) as router:
                client = await RawClient.connect(router.socket_path("researcher"))
                try:
                    found = await client.call("web_search_query", {"query": "rust book", "maxResults": 3})
                    busy = await client.call("web_search_query", {"query": "busy"})
                    refused = await client.call("web_search_query", {"query": "refused"})
                finally:
                    await client.close()
            assert not found.get("isError"), found
            jsonschema.validate(found["structuredContent"], TOOL["outputSchema"])
            assert found["structuredContent"]["results"][0]["url"] == "https://doc.rust-lang.org/book/"
            assert busy["isError"]
            assert body(busy)["error"] == "limit"
            assert body(refused)["error"] == "unavailable"
            assert "refused the API key" in body(refused)["message"]

        run(scenario())
    # The shipped binding's settings reach Brave.
    assert StandIn.seen[0]["country"] == ["US"]
    assert StandIn.seen[0]["safesearch"] == ["moderate"]
