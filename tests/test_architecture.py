"""docs/architecture.md §3 held against the code: its picture of the rooms' imports, its layer chain, its rooms table.

The picture is read from its mermaid source: a node's label names its room's folder or file (`cli/`,
`governance/store/`, `app.py`), a solid arrow says "imports", a dotted one says "never imports". The code's
imports are grimp's graph, the one import-linter checks its contracts on.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("reconciler", "conformance")
Chart = tuple[dict[str, str], set[tuple[str, str]], set[tuple[str, str]]]  # rooms by node id, solid and dotted arrows


def section_three() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index("## §3 "):text.index("## §4 ")]


def rooms_chart() -> str:
    """The mermaid source of §3's picture of the rooms and their imports."""
    section = section_three()
    after = section[section.index("**The rooms and their imports.**"):]
    return after[after.index("```mermaid") + len("```mermaid"):after.index("```", after.index("```mermaid") + 3)]


def room_module(label: str) -> str:
    """`cli/` -> reconciler.cli, `app.py` -> reconciler.app, `conformance/` -> conformance."""
    path = label.strip().rstrip("/").removesuffix(".py")
    dotted = path.replace("/", ".")
    top = dotted.split(".")[0]
    return dotted if top in PACKAGES else f"reconciler.{dotted}"


def read_chart(chart: str) -> Chart:
    """The chart's rooms (node id -> module), its solid arrows and its dotted ones, as (importer, imported) rooms."""
    nodes: dict[str, str] = {}
    solid: set[tuple[str, str]] = set()
    dotted: set[tuple[str, str]] = set()
    for raw in chart.splitlines():
        line = raw.strip()
        if not line or line.startswith(("flowchart", "%%")):
            continue
        declared = re.fullmatch(r'(\w+)\["([^"<]+)(?:<br/>[^"]*)?"\]', line)
        if declared:
            nodes[declared.group(1)] = room_module(declared.group(2))
            continue
        line = re.sub(r'\|"[^"]*"\|', "", line)  # an arrow's label says why, not what
        parts = re.split(r"\s*(-->|-\.->)\s*", line)
        if len(parts) < 3 or len(parts) % 2 == 0:
            pytest.fail(f"a line of the chart that is neither a node nor arrows: {raw!r}")
        for i in range(0, len(parts) - 2, 2):
            kind = solid if parts[i + 1] == "-->" else dotted
            for source in parts[i].split("&"):
                for target in parts[i + 2].split("&"):
                    kind.add((source.strip(), target.strip()))
    undeclared = sorted({name for arrow in solid | dotted for name in arrow} - set(nodes))
    assert undeclared == [], f"arrows name rooms the chart does not declare: {undeclared}"
    return nodes, {(nodes[a], nodes[b]) for a, b in solid}, {(nodes[a], nodes[b]) for a, b in dotted}


def room_of(module: str, rooms: set[str]) -> str | None:
    """The deepest room that holds `module`."""
    holders = [room for room in rooms if module == room or module.startswith(room + ".")]
    return max(holders, key=len, default=None)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


@pytest.fixture(scope="module")
def chart() -> Chart:
    return read_chart(rooms_chart())


def code_arrows(graph: grimp.ImportGraph, rooms: set[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """Each pair of rooms one imports the other directly, with one import that shows it."""
    arrows: dict[tuple[str, str], tuple[str, str]] = {}
    for module in graph.modules:
        source = room_of(module, rooms)
        for imported in graph.find_modules_directly_imported_by(module):
            target = room_of(imported, rooms)
            if source is not None and target is not None and source != target:
                arrows.setdefault((source, target), (module, imported))
    return arrows


def test_every_module_stands_in_a_room_of_the_picture(graph: grimp.ImportGraph, chart: Chart) -> None:
    rooms = set(chart[0].values())
    loose = sorted(m for m in graph.modules if m not in PACKAGES and room_of(m, rooms) is None)
    assert loose == [], f"modules in no room of docs/architecture.md §3's picture (add their room to it): {loose}"


def test_the_picture_draws_every_import_between_rooms_and_no_other(graph: grimp.ImportGraph, chart: Chart) -> None:
    nodes, drawn, _ = chart
    real = code_arrows(graph, set(nodes.values()))
    missing = sorted(f"{a} -> {b} ({real[a, b][0]} imports {real[a, b][1]})" for a, b in set(real) - drawn)
    invented = sorted(f"{a} -> {b}" for a, b in drawn - set(real))
    assert missing == [], f"docs/architecture.md §3 leaves out imports the code has: {missing}"
    assert invented == [], f"docs/architecture.md §3 draws imports the code does not have: {invented}"


def test_a_dotted_arrow_is_no_import(graph: grimp.ImportGraph, chart: Chart) -> None:
    nodes, _, never = chart
    real = code_arrows(graph, set(nodes.values()))
    assert never, "the picture's dotted arrow (the cli finds the conformance runner by entry point) is gone"
    assert sorted(f"{a} -> {b}" for a, b in never & set(real)) == []


def test_the_layer_chain_is_import_linters() -> None:
    chain = re.search(r"```\n(cli → [^\n]+)\n```", section_three())
    assert chain is not None, "docs/architecture.md §3 has no layer chain (`cli → app → ...`)"
    written = [sorted(floor.split(" | ")) for floor in chain.group(1).split(" → ")]
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = next(c["layers"] for c in config["tool"]["importlinter"]["contracts"]
                  if c["type"] == "layers" and "containers" not in c)
    enforced = [sorted(name.strip("()").removeprefix("reconciler.") for name in floor.split(" | ")) for floor in layers]
    assert written == enforced


def test_the_rooms_table_names_every_module_of_its_room() -> None:
    rows = dict(re.findall(r"^\| `([^`]+)` \| [^|]+ \| (.*) \|$", section_three(), flags=re.MULTILINE))
    unnamed = []
    for room, inside in rows.items():
        folder = ROOT / room
        if not folder.is_dir():
            continue
        for child in sorted(folder.iterdir()):
            package = child.is_dir() and (child / "__init__.py").exists()
            if package and f"{room.rstrip('/')}/{child.name}/" in rows:
                continue  # a room of its own
            name = f"`{child.name}/`" if package else f"`{child.name}`"
            if (package or (child.suffix == ".py" and child.name != "__init__.py")) and name not in inside:
                unnamed.append(f"{room}{child.name}")
    assert unnamed == [], f"docs/architecture.md §3's rooms table names no job for: {unnamed}"


def test_the_chart_reader_sees_a_drawn_import_that_is_not_there() -> None:
    nodes, solid, dotted = read_chart('    a["cli/<br/>x"]\n    b["governance/store/"]\n    c["conformance/"]\n'
                                      '    a --> b & c\n    a -.->|"never"| c\n')
    assert nodes == {"a": "reconciler.cli", "b": "reconciler.governance.store", "c": "conformance"}
    assert solid == {("reconciler.cli", "reconciler.governance.store"), ("reconciler.cli", "conformance")}
    assert dotted == {("reconciler.cli", "conformance")}
