"""What a connector names exists: the interface versions it implements, the code its `[run]` runs and,
in `[wrap]`, their tools, a reshaper the router knows and an error of their closed list. N001, N005,
N006, N007, N008.

Run by `check_tree` for each connector, again only when the connector or an interface changed.
"""

from __future__ import annotations

from collections.abc import Iterator

from reconciler.config.findings import Finding, suggest
from reconciler.config.models import WrapSpec
from reconciler.config.snapshot import RESHAPERS, Connector, Snapshot

__all__ = ["check_connector"]


def check_connector(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    file = f"{connector.folder}/connector.toml"
    for i, key in enumerate(connector.spec.implements):
        if key not in snapshot.interfaces:
            yield Finding(
                "N001",
                file,
                snapshot.line_of(file, "implements", i),
                f"implements '{key}', which does not exist{suggest(key, snapshot.interfaces).did_you_mean}",
                "an interface version of catalog/interfaces/, written name/vN",
                "correct the entry or add the interface version",
            )
    yield from _check_run(snapshot, connector)
    yield from _check_runtime(snapshot, connector)
    if connector.spec.wrap is not None:
        yield from _check_wrap(snapshot, connector, connector.spec.wrap)


# What a command argument names when it is the connector's own code: a script, or a path from its folder.
_CODE_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts", ".sh", ".rb", ".pl", ".lua")


def _check_run(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    """N007: a file of the connector's own folder that `[run]` runs is there (a manifest without code is a stub).

    Only relative names are checked: an absolute path or a program on PATH belongs to the machine,
    which `handler validate` (run in pull requests, elsewhere) cannot see.
    """
    file = f"{connector.folder}/connector.toml"
    for i, arg in enumerate(connector.spec.run.command or ()):
        own = arg.startswith("./") or (not arg.startswith(("-", "/")) and arg.endswith(_CODE_SUFFIXES))
        name = arg.removeprefix("./")
        if own and name not in connector.files:
            yield Finding(
                "N007",
                file,
                snapshot.line_of(file, "run", "command", i),
                f"[run] runs '{arg}', which is not in {connector.folder}: a manifest without code is a stub",
                f"the connector's code in its own folder, e.g. {connector.folder}/{name}",
                f"add {connector.folder}/{name}, or correct [run] command",
            )


# The runtimes a tree provides by name: the service's Python, or the connector's own environment's (`[needs]`).
PYTHON_RUNTIMES = ("python", "python3")


def _check_runtime(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    """N008: the runtime `[run]` names exists wherever the tree runs: `python`/`python3` (the service's Python, or
    the connector's own environment when `[needs] python` declares packages), an absolute path (the machine's,
    unseen here), or a program `[needs] programs` declares, which the connector's start then checks on that
    machine. Any other bare name (`node`, `python3.12`) would be found, or not, on whatever PATH runs it."""
    command = connector.spec.run.command
    if not command:
        return
    program = command[0]
    needs = connector.spec.needs
    if "/" in program or program in PYTHON_RUNTIMES or program in needs.programs:
        return
    file = f"{connector.folder}/connector.toml"
    yield Finding(
        "N008",
        file,
        snapshot.line_of(file, "run", "command", 0),
        f"[run] runs '{program}', a runtime this tree does not provide and [needs] does not declare",
        "python or python3 (the service's Python, or the connector's own environment with [needs] python), "
        "or a program [needs] programs declares",
        f'run it with python3 (with [needs] python = ["..."] for its packages), or declare it: '
        f'[needs] programs = ["{program}"] (and debian = ["<its package>"])',
    )


def _check_wrap(snapshot: Snapshot, connector: Connector, wrap: WrapSpec) -> Iterator[Finding]:
    file = f"{connector.folder}/connector.toml"
    served = snapshot.tool_names(connector.spec.implements)
    for tool in wrap.tools:
        if tool not in served:
            hint = suggest(tool, sorted(served), none="(no tools)")
            yield Finding(
                "N005",
                file,
                snapshot.line_of(file, "wrap", "tools", tool),
                f"[wrap] maps '{tool}', which no implemented interface defines{hint.did_you_mean}",
                hint.one_of,
                "correct the tool name",
            )
    if wrap.reshape is not None and wrap.reshape not in RESHAPERS:
        hint = suggest(wrap.reshape, RESHAPERS)
        yield Finding(
            "N006",
            file,
            snapshot.line_of(file, "wrap", "reshape"),
            f"[wrap] reshape '{wrap.reshape}' is not a reshaper the router knows{hint.did_you_mean}",
            hint.one_of,
            'reshape = "text" (text content as {"text": ...}), or omit it to pass structuredContent through',
        )
    codes: frozenset[str] = frozenset().union(
        *(iface.error_codes for k in connector.spec.implements if (iface := snapshot.interfaces.get(k)))
    )
    if wrap.error is not None and wrap.error not in codes:
        hint = suggest(wrap.error, sorted(codes))
        yield Finding(
            "N006",
            file,
            snapshot.line_of(file, "wrap", "error"),
            f"[wrap] error '{wrap.error}' is not in the closed list of the interfaces it implements{hint.did_you_mean}",
            hint.one_of,
            "name an error code of the interface, or omit it (unavailable)",
        )
