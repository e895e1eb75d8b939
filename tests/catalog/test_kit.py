"""The connector kit (handler_kit): what a connector serves is its interface's tools.json as the tree holds it, a
third-party connector written on it runs from its own folder in its sandbox, and its version is in the hash a
conformance result names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from handler_kit import Interface, InterfaceError, Reply, build_server, find_interface

from reconciler.config import loading
from reconciler.config.loading import Loader
from reconciler.config.sources import FolderSource
from reconciler.connectors.sandbox import sandbox_support
from tests.fixtures.harness import RawClient, body, run, serving, short_dir
from tests.fixtures.vendor_trees import listed_tools

REPO = Path(__file__).resolve().parents[2]
CHANGED = "Search the public web (a description changed in this copy of the interface only)."

# A third party's connector of web-search/v1, in its own folder of its own tree: all it writes is its search.
MY_SEARCH = '''
from typing import Any

from handler_kit import InterfaceError, Reply, serve


async def web_search_query(args: dict[str, Any]) -> Reply:
    if args["query"] == "busy":
        raise InterfaceError("limit", "my search is busy; wait a minute before searching again", retry="never")
    if args["query"] == "odd":
        raise InterfaceError("odd_code", "a code web-search/v1 does not declare")
    hit = {"title": "Found " + args["query"], "url": "https://example.org/", "snippet": ""}
    return Reply({"results": [hit]}, hit["title"])


serve("web-search/v1", "my-search", {"web_search_query": web_search_query},
      failed="my search failed; retrying later may work")
'''


def change_description(interfaces: Path) -> None:
    path = interfaces / "web-search/v1/tools.json"
    tools = json.loads(path.read_text())
    tools[0]["description"] = CHANGED
    path.write_text(json.dumps(tools, indent=2))


def test_a_connector_serves_the_description_of_the_interface_its_tree_holds(shipped_tree: Path) -> None:
    change_description(shipped_tree / "catalog/interfaces")
    listed = listed_tools(shipped_tree / "catalog/connectors/web-search-brave/main.py", {"BRAVE_API_KEY": "k"})
    assert [t["description"] for t in listed] == [CHANGED]
    original = json.loads((REPO / "catalog/interfaces/web-search/v1/tools.json").read_text())[0]
    assert {**listed[0], "description": original["description"]} == original  # the rest, verbatim


def test_the_interfaces_the_router_names_come_before_the_tree_around_the_connector(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "catalog/interfaces/web-search/v1", copy / "web-search/v1")
    change_description(copy)
    listed = listed_tools(REPO / "catalog/connectors/web-search-searxng/main.py",
                          {"SEARXNG_URL": "http://127.0.0.1:9", "HANDLER_INTERFACES": str(copy)})
    assert [t["description"] for t in listed] == [CHANGED]


def test_a_connector_that_answers_other_tools_than_its_interface_is_refused_at_start() -> None:
    interface = find_interface("web-search/v1", REPO / "catalog/connectors/web-search-brave")

    async def nothing(args: dict[str, object]) -> Reply:
        return Reply({}, "")

    with pytest.raises(ValueError, match=r"web-search/v1 has the tools \['web_search_query'\]"):
        build_server(interface, "wrong", {"web_search": nothing}, failed="x")


def test_an_interface_not_found_says_where_it_looked_and_how_to_point_at_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDLER_INTERFACES", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LookupError, match=r"set HANDLER_INTERFACES to the folder holding web-search/v1/tools\.json"):
        find_interface("web-search/v1", tmp_path)
    with pytest.raises(LookupError, match="name one as name/vN"):
        find_interface("web-search", tmp_path)


def test_the_closed_errors_and_tools_are_the_interfaces() -> None:
    interface = Interface.read("tts/v1", REPO / "catalog/interfaces/tts/v1")
    assert interface.errors == {"voice_unknown", "unavailable"}
    tools = json.loads((REPO / "catalog/interfaces/tts/v1/tools.json").read_text())
    assert [t.model_dump(by_alias=True, exclude_none=True) for t in interface.tools] == tools
    assert InterfaceError("limit", "m", retry="soon").retry is None  # only later or never mean anything


def write_my_search(tree: Path) -> None:
    """`my-search`, a third party's connector folder, and the shipped search binding moved onto it."""
    folder = tree / "catalog/connectors/my-search"
    folder.mkdir()
    (folder / "main.py").write_text(MY_SEARCH)
    (folder / "PROVISIONING.md").write_text("# my-search\n\nNothing to provision.\n")
    (folder / "connector.toml").write_text(
        'apiVersion = "handler.connector/v1"\nname = "my-search"\ndescription = "A search of our own"\n'
        'implements = ["web-search/v1"]\negress = []\n\n[run]\ncommand = ["python3", "main.py"]\n'
        'transport = "stdio"\n')
    (tree / "config/bindings/search-brave.toml").write_text(
        'apiVersion = "handler.binding/v1"\nname = "search-brave"\nconnector = "my-search"\n'
        'description = "Our own search"\n\n[pricing]\nweb_search_query = 0.005\n')


def test_a_third_party_connector_on_the_kit_runs_from_its_own_folder_in_its_sandbox(shipped_tree: Path) -> None:
    assert sandbox_support().ok, sandbox_support().reason
    write_my_search(shipped_tree)
    change_description(shipped_tree / "catalog/interfaces")  # the tree's own interface, bound into the sandbox

    async def scenario() -> None:
        with short_dir() as run_dir:
            async with serving(shipped_tree, run_dir) as router:
                client = await RawClient.connect(router.socket_path("researcher"))
                try:
                    found = await client.call("web_search_query", {"query": "kits"})
                    busy = await client.call("web_search_query", {"query": "busy"})
                    odd = await client.call("web_search_query", {"query": "odd"})
                finally:
                    await client.close()
                status = router.services.pool.statuses["search-brave"]
        assert body(found) == {"results": [{"title": "Found kits", "url": "https://example.org/", "snippet": ""}]}
        assert body(busy)["error"] == "limit"
        assert busy["_meta"]["handler/retry"] == "never"  # the connector's word, past the router
        assert body(odd)["error"] == "unavailable"  # a code outside the closed list never reaches the model
        assert (status.state, status.drift) == ("running", ())  # what it lists is its interface, to the letter

    run(scenario(), timeout=120)


def test_a_conformance_result_names_the_kit_version_its_connector_ran_on(shipped_tree: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def hashes() -> dict[str, str]:
        snapshot = Loader().load(FolderSource(shipped_tree))
        return {name: c.content_hash for name, c in snapshot.connectors.items()}

    before = hashes()
    monkeypatch.setattr(loading, "kit_hash", lambda: "another kit")
    after = hashes()
    assert before["web-search-brave"] != after["web-search-brave"]  # written on the kit
    assert before["web-fetch-mcp"] == after["web-fetch-mcp"]  # a wrapped server: no kit in its folder
