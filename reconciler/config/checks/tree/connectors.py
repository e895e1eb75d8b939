"""What a connector names exists: the interface versions it implements, the code its `[run]` runs and the
runtime it names, and, in `[wrap]`, their tools and arguments, a reshaper the router knows, errors of their
closed list and error patterns that compile. N001, N005, N006, N007, N008, N009, N010, N011.

Run by `check_tree` for each connector, again only when the connector or an interface changed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator

from reconciler.config.findings import Finding, suggest
from reconciler.config.models import WrapSpec, WrapTool
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
    yield from _check_outside(snapshot, connector)
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


# What a sandbox shows of the machine wherever it runs: the system's folders, read-only (connectors.sandbox).
_SYSTEM_FOLDERS = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/")


def _check_outside(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    """N011: an absolute path `[run]` passes (after the program) outside the system's folders: the sandbox shows
    a connector its own folder, not the machine's others, so it would fail to start wherever it is sandboxed.
    A warning: the path is the machine's, and a router started with `--no-sandbox` can reach it."""
    file = f"{connector.folder}/connector.toml"
    for i, arg in enumerate(connector.spec.run.command or ()):
        if i == 0 or not arg.startswith("/") or arg.startswith(_SYSTEM_FOLDERS):
            continue
        name = arg.rstrip("/").rsplit("/", 1)[-1] or "main.py"
        yield Finding(
            "N011",
            file,
            snapshot.line_of(file, "run", "command", i),
            f"[run] passes '{arg}', outside {connector.folder}: the sandbox shows a connector its own folder "
            "and the system's (/usr), so the connector cannot open it",
            "the connector's code and data in its own folder, named relative to it",
            f"copy it into {connector.folder}/ and name it relatively (e.g. '{name}')",
        )


# The runtimes a tree provides by name: the service's Python, or the connector's own environment's (`[needs]`).
PYTHON_RUNTIMES = ("python", "python3")


def _check_runtime(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    """N010: the runtime `[run]` names exists wherever the tree runs: `python`/`python3` (the service's Python, or
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
        "N010",
        file,
        snapshot.line_of(file, "run", "command", 0),
        f"[run] runs '{program}', a runtime this tree does not provide and [needs] does not declare",
        "python or python3 (the service's Python, or the connector's own environment with [needs] python), "
        "or a program [needs] programs declares",
        f'run it with python3 (with [needs] python = ["..."] for its packages), or declare it: '
        f'[needs] programs = ["{program}"] (and debian = ["<its package>"])',
    )


def _check_wrap(snapshot: Snapshot, connector: Connector, wrap: WrapSpec) -> Iterator[Finding]:
    """N005, N006, N008, N009: what `[wrap]` names exists on the interface's side.

    The server's side (its tools, its arguments) is checked when the process starts, against its
    own `tools/list` (`connectors.wrapping.check_wrap`): a save-time check cannot run it.
    """
    file = f"{connector.folder}/connector.toml"
    served = snapshot.tool_names(connector.spec.implements)
    codes: frozenset[str] = frozenset().union(
        *(iface.error_codes for k in connector.spec.implements if (iface := snapshot.interfaces.get(k)))
    )
    fields = _argument_names(snapshot, connector)
    for tool, given in wrap.tools.items():
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
        elif isinstance(given, WrapTool):
            at = ("wrap", "tools", tool)
            yield from _check_reshape(snapshot, file, given.reshape, at)
            yield from _check_renames(snapshot, file, given.arguments, fields.get(tool, set()), at, f"'{tool}'")
            for i, mapped in enumerate(given.errors):
                yield from _check_error(snapshot, file, mapped.error, codes, (*at, "errors", i, "error"))
                yield from _check_pattern(snapshot, file, mapped.match, (*at, "errors", i, "match"))
    yield from _check_reshape(snapshot, file, wrap.reshape, ("wrap",))
    every = set().union(*fields.values()) if fields else set()
    yield from _check_renames(snapshot, file, wrap.arguments, every, ("wrap",), "any tool it serves")
    if wrap.error is not None:
        yield from _check_error(snapshot, file, wrap.error, codes, ("wrap", "error"))


def _argument_names(snapshot: Snapshot, connector: Connector) -> dict[str, set[str]]:
    """Each tool the connector serves → the argument names of its interface's inputSchema."""
    names: dict[str, set[str]] = {}
    for key in connector.spec.implements:
        iface = snapshot.interfaces.get(key)
        for tool in iface.tools if iface else ():
            names.setdefault(tool.name, set()).update((tool.inputSchema.get("properties") or {}).keys())
    return names


def _check_reshape(snapshot: Snapshot, file: str, reshape: str | None, at: tuple[str, ...]) -> Iterator[Finding]:
    if reshape is not None and reshape not in RESHAPERS:
        hint = suggest(reshape, RESHAPERS)
        yield Finding(
            "N006",
            file,
            snapshot.line_of(file, *at, "reshape"),
            f"[wrap] reshape '{reshape}' is not a reshaper the router knows{hint.did_you_mean}",
            hint.one_of,
            'reshape = "text" (text content as {"text": ...}), or omit it to pass structuredContent through',
        )


def _check_error(snapshot: Snapshot, file: str, code: str, codes: frozenset[str],
                 at: tuple[str | int, ...]) -> Iterator[Finding]:
    if code not in codes:
        hint = suggest(code, sorted(codes))
        yield Finding(
            "N006",
            file,
            snapshot.line_of(file, *at),
            f"[wrap] error '{code}' is not in the closed list of the interfaces it implements{hint.did_you_mean}",
            hint.one_of,
            "name an error code of the interface, or omit it (unavailable)",
        )


def _check_renames(snapshot: Snapshot, file: str, renames: dict[str, str], known: set[str],
                   at: tuple[str, ...], whose: str) -> Iterator[Finding]:
    """N008: a renamed argument is one the interface tool takes (else the rename never applies)."""
    for ours, theirs in renames.items():
        if ours not in known:
            hint = suggest(ours, sorted(known), none="(no arguments)")
            close = difflib.get_close_matches(ours, sorted(known), n=1)
            yield Finding(
                "N008",
                file,
                snapshot.line_of(file, *at, "arguments", ours),
                f"[wrap] renames the argument '{ours}' (to the server's '{theirs}'), which the inputSchema of "
                f"{whose} does not have{hint.did_you_mean}",
                f"an argument of the interface's inputSchema, {hint.one_of}",
                f"arguments = {{ {close[0] if close else 'argument'} = \"{theirs}\" }}, naming the interface's "
                "argument first, the server's second",
            )


def _check_pattern(snapshot: Snapshot, file: str, pattern: str, at: tuple[str | int, ...]) -> Iterator[Finding]:
    """N009: an error pattern compiles as a regular expression."""
    try:
        re.compile(pattern)
    except re.error as exc:
        yield Finding(
            "N009",
            file,
            snapshot.line_of(file, *at),
            f"[wrap] error pattern {pattern!r} is not a regular expression: {exc}",
            "a Python regular expression, searched in the server's error text",
            f"match = '{re.escape(pattern)}' to match the text as it is (in single quotes, TOML keeps the "
            "backslashes)",
        )
