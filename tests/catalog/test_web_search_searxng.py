"""The SearXNG connector against a loopback stand-in for a SearXNG instance: results mapped onto web-search/v1,
every failure onto its closed list, and the same through the real, sandboxed router and `handler connector
check`.

The stand-in checks what an instance behind a Basic-auth reverse proxy checks (GET on `/search`, the login,
a `q` and `format=json`) and answers 400 to any other request, 401 to a wrong login. It searches a small
fixed set of pages by the words of the query, so the interface's conformance cases run against it; a few
reserved queries play back failures.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import jsonschema
import pytest

from tests.fixtures.harness import body, short_dir
from tests.fixtures.loopback import QuietHandler, serving_http
from tests.fixtures.vendor_trees import (
    calls_through_router,
    egress_of,
    passing_check,
    stand_in_record,
    stand_in_replay,
    write_tree,
)

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/web-search-searxng/main.py"
TOOL = json.loads((REPO / "catalog/interfaces/web-search/v1/tools.json").read_text())[0]
USER, PASSWORD = "agents", "proxy-password"

# What the stand-in searches: title, address, content.
PAGES = [
    ("Welcome to Python.org", "https://www.python.org/", "The official home of the Python Programming Language."),
    ("Python (programming language) - Wikipedia", "https://en.wikipedia.org/wiki/Python_(programming_language)",
     "Python is a high-level, general-purpose programming language."),
    ("JSON Schema", "https://json-schema.org/", "JSON Schema is the vocabulary that enables JSON data consistency."),
    ("JSON Schema specification", "https://json-schema.org/specification", "The current version is 2020-12."),
    ("Understanding JSON Schema", "https://json-schema.org/understanding-json-schema",
     "A website aiming to provide more accessible documentation for JSON schema."),
    ("Model Context Protocol", "https://modelcontextprotocol.io/", "An open protocol that connects AI applications "
     "to data sources &amp; tools."),
    ("Model Context Protocol specification", "https://modelcontextprotocol.io/specification/",
     "The <span class=\"highlight\">protocol</span> uses JSON-RPC 2.0 messages."),
    ("The Rust Programming Language", "https://doc.rust-lang.org/book/", "Learn Rust and its ownership model."),
    ("no address", "", "skipped: a result needs a web address"),
    ("script", "javascript:alert(1)", "skipped: not a web address"),
]
FAILING = {"too many requests": [["duckduckgo", "Suspended: too many requests"], ["brave", "CAPTCHA"]],
           "engines down": [["duckduckgo", "timeout"], ["wikipedia", "HTTP error"]]}


def matches(query: str) -> list[dict[str, Any]]:
    """The pages sharing a word with the query, most shared words first, as SearXNG items."""
    words = set(re.findall(r"[a-z0-9]+", query.lower()))
    scored = []
    for position, (title, url, content) in enumerate(PAGES):
        shared = len(words & set(re.findall(r"[a-z0-9]+", f"{title} {content}".lower())))
        if shared:
            scored.append((-shared, position, {"title": title, "url": url, "content": content, "engine": "brave",
                                                "engines": ["brave"], "score": float(shared), "category": "general"}))
    return [item for *_, item in sorted(scored, key=lambda s: (s[0], s[1]))]


class SearXNG(QuietHandler):
    """A SearXNG instance's JSON search, as far as the connector uses it."""

    seen: ClassVar[list[dict[str, list[str]]]] = []
    refused: ClassVar[list[str]] = []
    per_page: ClassVar[int] = 3

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            self.refused.append("auth")
            self.send_body(401, b"401 Authorization Required (nginx)", "text/html")
            return
        if url.path != "/search" or not query.get("q") or query.get("format") != ["json"]:
            self.refused.append("shape")
            self.send_body(400, b"Bad Request <secret instance wording>", "text/html")
            return
        self.seen.append(query)
        self.answer(query["q"][0], int(query.get("pageno", ["1"])[0]))

    def do_POST(self) -> None:
        self.refused.append("method")
        self.send_body(400, b"GET only here")

    def answer(self, q: str, page: int) -> None:
        if q in ("limited", "limited without a delay"):
            self.send_response(429)
            if q == "limited":
                self.send_header("Retry-After", "7")
            self.send_header("content-length", "0")
            self.end_headers()
        elif q in ("403", "502", "503"):
            self.send_body(int(q), b"Traceback (most recent call last): <secret instance wording>")
        elif q == "slow":
            time.sleep(1.0)
            self.send_body(200, b'{"results": []}', "application/json")
        elif q == "garbled":
            self.send_body(200, b"<html>not json</html>", "application/json")
        elif q == "odd":
            self.send_body(200, b'{"results": "nope"}', "application/json")
        elif q == "huge":
            self.send_body(200, b'{"results": [' + b" " * 300_000 + b"]}", "application/json")
        else:
            items = matches(q)[(page - 1) * self.per_page: page * self.per_page]
            body = {"query": q, "number_of_results": 0, "results": items, "answers": [], "corrections": [],
                    "infoboxes": [], "suggestions": [], "unresponsive_engines": [] if items else FAILING.get(q, [])}
            self.send_body(200, json.dumps(body).encode(), "application/json")


def load_connector() -> ModuleType:
    spec = importlib.util.spec_from_file_location("web_search_searxng_main", CONNECTOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def searxng(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, str]]:
    """The connector module and the stand-in's base URL (no request seen yet)."""
    monkeypatch.setattr(SearXNG, "seen", [])
    monkeypatch.setattr(SearXNG, "refused", [])
    with serving_http(SearXNG) as url:
        yield load_connector(), url


def settings(module: ModuleType, url: str, **given: Any) -> Any:
    return module.Settings(**{"base_url": url, "username": USER, "password": PASSWORD, **given})


def search(subject: tuple[ModuleType, str], query: str, count: int = 10, **given: Any) -> dict[str, Any]:
    module, url = subject
    output: dict[str, Any] = asyncio.run(module.search(query, count, settings(module, url, **given)))
    return output


def failure(subject: tuple[ModuleType, str], query: str, **given: Any) -> tuple[str, str]:
    error = raised(subject, query, **given)
    return error.code, error.message


def raised(subject: tuple[ModuleType, str], query: str, **given: Any) -> Any:
    """The interface error a search raises: its code, message and `retry`."""
    with pytest.raises(subject[0].InterfaceError) as caught:
        search(subject, query, **given)
    return caught.value


def test_results_map_onto_the_interface_and_validate(searxng: tuple[ModuleType, str]) -> None:
    output = search(searxng, "model context protocol", count=2, language="fr", safesearch="strict",
                    engines="brave,wikipedia")
    jsonschema.validate(output, TOOL["outputSchema"])
    assert output == {"results": [
        {"title": "Model Context Protocol", "url": "https://modelcontextprotocol.io/",
         "snippet": "An open protocol that connects AI applications to data sources & tools."},
        {"title": "Model Context Protocol specification", "url": "https://modelcontextprotocol.io/specification/",
         "snippet": "The protocol uses JSON-RPC 2.0 messages."},
    ]}
    assert SearXNG.seen == [{"q": ["model context protocol"], "format": ["json"], "categories": ["general"],
                             "pageno": ["1"], "safesearch": ["2"], "language": ["fr"],
                             "engines": ["brave,wikipedia"]}]


def test_a_second_page_is_read_only_when_the_first_is_short(searxng: tuple[ModuleType, str]) -> None:
    found = search(searxng, "json schema python programming language", count=5)
    assert len(found["results"]) == 5
    assert len({r["url"] for r in found["results"]}) == 5
    assert [q["pageno"] for q in SearXNG.seen] == [["1"], ["2"]]
    SearXNG.seen.clear()
    assert [r["url"] for r in search(searxng, "rust ownership")["results"]] == ["https://doc.rust-lang.org/book/"]
    assert [q["pageno"] for q in SearXNG.seen] == [["1"], ["2"]]  # the second page was empty: no third asked
    SearXNG.seen.clear()
    assert len(search(searxng, "json schema", count=2)["results"]) == 2
    assert [q["pageno"] for q in SearXNG.seen] == [["1"]]


def test_no_match_is_an_empty_list(searxng: tuple[ModuleType, str]) -> None:
    assert search(searxng, "zzzz qqqq") == {"results": []}


@pytest.mark.parametrize(("query", "code", "says", "retry"), [
    ("limited", "limit", "rate limit was reached; retry after 7 seconds", None),
    ("limited without a delay", "limit", "wait a moment before searching again", None),
    ("too many requests", "limit", "rate limiting it (2 suspended)", None),
    ("engines down", "unavailable", "did not answer (2 failed)", None),
    ("403", "unavailable", "allow JSON output", "never"),  # until its operator changes its settings
    ("502", "unavailable", "failing (HTTP 502)", None),
    ("503", "unavailable", "failing (HTTP 503)", None),
    ("garbled", "unavailable", "not JSON", None),
    ("odd", "unavailable", "not a search result", None),
])
def test_each_failure_maps_onto_the_closed_list(searxng: tuple[ModuleType, str], query: str, code: str,
                                                says: str, retry: str | None) -> None:
    error = raised(searxng, query)
    got, message = error.code, error.message
    assert got == code
    assert says in message
    assert error.retry == retry
    assert "Traceback" not in message
    assert "secret" not in message


def test_a_refused_login_is_unavailable(searxng: tuple[ModuleType, str]) -> None:
    error = raised(searxng, "python", password="wrong")  # noqa: S106 - a wrong one, on purpose
    code, message = error.code, error.message
    assert (code, "refused the login (HTTP 401)" in message, error.retry) == ("unavailable", True, "never")
    assert "do without this service for now and tell the user" in message
    assert "nginx" not in message
    assert failure(searxng, "python", username=None)[0] == "unavailable"
    assert SearXNG.refused == ["auth", "auth"]


def test_a_timeout_an_oversized_body_and_no_server_are_unavailable(searxng: tuple[ModuleType, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = searxng
    monkeypatch.setattr(module, "TIMEOUT_SECONDS", 0.2)
    assert failure(searxng, "slow") == ("unavailable", "the search instance did not answer in time; retrying "
                                        "later may work")
    monkeypatch.setattr(module, "MAX_BODY", 64 * 1024)
    code, message = failure(searxng, "huge")
    assert (code, "far larger" in message) == ("unavailable", True)
    code, message = failure((module, "http://127.0.0.1:9"), "python")
    assert (code, "could not be reached" in message) == ("unavailable", True)


def test_a_request_of_the_wrong_shape_is_refused_by_the_stand_in(searxng: tuple[ModuleType, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = searxng
    right = module.request_params
    monkeypatch.setattr(module, "request_params", lambda query, page, given: {"q": query, "pageno": str(page)})
    refused = raised(searxng, "python")
    assert (refused.code, refused.retry) == ("unavailable", "never")
    assert refused.message.startswith("the search instance did not accept the request (HTTP 400); an administrator")
    monkeypatch.setattr(module, "request_params", right)
    monkeypatch.setattr(module, "SEARCH_PATH", "/")
    assert failure(searxng, "python")[1].startswith("the search instance did not accept the request (HTTP 400)")
    assert SearXNG.refused == ["shape", "shape"]
    assert SearXNG.seen == []


@pytest.mark.parametrize(("url", "says"), [
    ("", "SEARXNG_URL is not set"),
    ("search.example.org", "must be an http:// or https:// address"),
    ("https://user:pw@search.example.org", "must not hold a login"),
])
def test_a_missing_or_bad_instance_address_is_unavailable_without_a_request(searxng: tuple[ModuleType, str],
                                                                            url: str, says: str) -> None:
    code, message = failure((searxng[0], url), "python")
    assert (code, says in message) == ("unavailable", True)
    assert "pw" not in message
    assert SearXNG.seen == SearXNG.refused == []


BINDING = """apiVersion = "handler.binding/v1"
name = "search-test"
connector = "web-search-searxng"
secrets = {{ password = {{ env = "TEST_SEARXNG_PASSWORD" }} }}
settings = {{ url = "{url}", username = "{user}", safesearch = "off" }}
egress = ["{egress}"]  # the stand-in's exact address: the only loopback address the sandbox's proxy allows

[pricing]
web_search_query = 0.0
"""


@pytest.fixture
def searxng_tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config tree whose binding `search-test` points at a running stand-in; the tester profile uses it."""
    monkeypatch.setenv("TEST_SEARXNG_PASSWORD", PASSWORD)
    monkeypatch.setattr(SearXNG, "seen", [])
    with serving_http(SearXNG) as url, short_dir() as folder:
        text = BINDING.format(url=url, user=USER, egress=egress_of(url))
        yield write_tree(folder / "t", "search-test", text, "web-search")


def test_through_the_sandboxed_router(searxng_tree: Path) -> None:
    found, limited = calls_through_router(searxng_tree, "web_search_query",  # sandboxed
                                          {"query": "json schema", "maxResults": 3}, {"query": "limited"})
    assert not found.get("isError"), found
    jsonschema.validate(found["structuredContent"], TOOL["outputSchema"])
    assert found["structuredContent"]["results"][0]["url"] == "https://json-schema.org/"
    assert limited["isError"] is True
    assert body(limited)["error"] == "limit"
    assert SearXNG.seen[0]["safesearch"] == ["0"]  # the binding's settings reach the instance


def test_connector_check_passes_against_the_stand_in(searxng_tree: Path, tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    summary = passing_check("web-search-searxng", "search-test", searxng_tree, "web-search/v1",
                            **stand_in_replay(seed=3, examples=10), result=tmp_path / "result.json", capfd=capfd,
                            record=stand_in_record())
    assert summary["cases"]["passed"] == 3
    assert summary["fuzzing_pass"]
