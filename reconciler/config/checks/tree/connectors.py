"""What a connector names exists: the interface versions it implements, the code its `[run]` runs and the
runtime it names, and, in `[wrap]`, their tools and arguments, a reshaper the router knows, errors of their
closed list and error patterns that compile; and that its folder holds no compiled Python. N001, N005, N006,
N007, N008, N009, N010, N011, N012, N013.

Run by `check_tree` for each connector, again only when the connector or an interface changed.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

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
    yield from _check_compiled(connector)
    yield from _check_run(snapshot, connector)
    yield from _check_outside(snapshot, connector)
    yield from _check_runtime(snapshot, connector)
    if connector.spec.wrap is not None:
        yield from _check_wrap(snapshot, connector, connector.spec.wrap)


def _check_compiled(connector: Connector) -> Iterator[Finding]:
    """N013: a compiled file anywhere in the folder. Python imports a loose `helper.pyc` where no `helper.py` is,
    whatever its cache settings, so code no reviewer can read would run; the sandbox's Python ignores the
    folder's `__pycache__` (docs/architecture.md §6), and a file there is refused all the same."""
    for name in sorted(connector.files):
        if name.endswith((".pyc", ".pyo")):
            yield Finding(
                "N013",
                f"{connector.folder}/{name}",
                1,
                f"{connector.folder}/{name} is compiled Python: review reads sources, and Python may run this "
                "file in place of one",
                "only source files in a connector's folder; Python compiles them itself where it runs",
                f"remove {connector.folder}/{name} (and add __pycache__/ and *.pyc to .gitignore)",
            )


# The runtimes a connector's code may run on, by the program's name (`python3.12`, `/usr/bin/node`): the flags
# whose value is code itself (`python -c`), those that take the next argument, and whether `-m module` runs code.
@dataclass(frozen=True)
class _Runtime:
    inline: str  # short flags: python's c, node's e and p
    long_inline: tuple[str, ...] = ()
    valued: str = ""  # short flags taking a value: python's W and X
    long_valued: tuple[str, ...] = ()
    modules: bool = False


_RUNTIMES = {
    "python": _Runtime("c", valued="WX", modules=True),
    "node": _Runtime("ep", ("--eval", "--print"), "r", ("--require", "--import")),
    "ruby": _Runtime("e", valued="rI"),
    "perl": _Runtime("eE", valued="IM"),
    "lua": _Runtime("e", valued="l"),
    "sh": _Runtime("c", valued="o"),
}
_RUNTIME_NAME = re.compile(r"^(?P<name>python|node|ruby|perl|lua|sh)[0-9.]*$")
_RUNTIME_ALIASES = {"nodejs": "node", "bash": "sh", "dash": "sh", "zsh": "sh"}


def _runtime_of(program: str) -> _Runtime | None:
    base = program.rsplit("/", 1)[-1]
    match = _RUNTIME_NAME.match(_RUNTIME_ALIASES.get(base, base))
    return _RUNTIMES[match["name"]] if match else None


@dataclass(frozen=True)
class _Code:
    """What of `[run] command` is the connector's code: a program, a script, a module or inline code."""

    kind: Literal["program", "script", "module", "inline", "none"]
    index: int  # of the argument naming it (the flag, for inline code)
    name: str = ""


def _code_of(command: Sequence[str]) -> _Code:
    program = command[0]
    runtime = _runtime_of(program)
    if runtime is None:
        return _Code("program", 0, program)
    i = 1
    while i < len(command):
        arg = command[i]
        if arg == "--":  # what follows is the script and its arguments
            i += 1
            break
        if arg.startswith("--"):
            if arg in runtime.long_inline:
                return _Code("inline", i, arg)
            i += 2 if arg in runtime.long_valued else 1
            continue
        if arg.startswith("-") and arg != "-":
            for j, flag in enumerate(arg[1:], 2):
                rest = arg[j:]
                if flag in runtime.inline:
                    return _Code("inline", i, arg)
                if runtime.modules and flag == "m":
                    module = rest or (command[i + 1] if i + 1 < len(command) else "")
                    return _Code("module", i if rest else i + 1, module)
                if flag in runtime.valued:
                    i += 0 if rest else 1
                    break
            i += 1
            continue
        break
    return _Code("script", i, command[i]) if i < len(command) else _Code("none", 0)


def _distribution(requirement: str) -> str:
    """A requirement's package name as an importable module is usually named ("mcp-server-fetch" → mcp_server_fetch)."""
    return re.sub(r"[-_.]+", "_", re.split(r"[^A-Za-z0-9._-]", requirement.strip(), maxsplit=1)[0]).lower()


def _check_run(snapshot: Snapshot, connector: Connector) -> Iterator[Finding]:
    """N007, N012: `[run]` runs code of the connector's own folder (a manifest without code is a stub): a program
    of the folder, a runtime (python3, node, sh, ...) running a script of the folder, or `python -m` a module of a
    package `[needs] python` declares. Inline code (`-c`, `-e`), a path out of the folder and a program of the
    machine run code nobody reviews with the tree, and that `handler validate` cannot see."""
    command = connector.spec.run.command
    if not command:
        return
    file = f"{connector.folder}/connector.toml"
    folder = connector.folder
    code = _code_of(command)
    if "/" in command[0] and not command[0].startswith("/"):  # a program of the folder, or a runtime kept in it
        found = list(_check_own(snapshot, connector, 0, command[0]))
        yield from found
        if found or code.kind == "program":
            return
    if code.kind == "script":
        yield from _check_own(snapshot, connector, code.index, code.name)
        return
    if code.kind == "module":
        top = code.name.split(".", 1)[0]
        if top and top.lower() in {_distribution(r) for r in connector.spec.needs.python}:
            return
        script = f"{top}.py" if f"{top}.py" in connector.files else f"{top}/__main__.py"
        own = script in connector.files
        yield Finding(
            "N007",
            file,
            snapshot.line_of(file, "run", "command", code.index),
            f"[run] runs the module '{code.name}', which no package [needs] python declares"
            + (" (a module of the folder is not on the path of a connector, which runs in a call folder)"
               if own else f" and {folder} does not hold: a manifest without code is a stub"),
            f"a script of {folder} (python3 main.py), or -m a module of a package [needs] python declares",
            f'command = ["python3", "{script}"]' if own else
            f'[needs] python = ["<the package holding {top}>"], or add {folder}/main.py and run it with '
            f'command = ["python3", "main.py"]',
        )
        return
    program = command[0]
    if code.kind == "inline":
        what = f"runs inline code ('{program} {code.name} ...')"
    elif code.kind == "none":
        what = f"runs '{program}' without a script of {folder} (it would read its code from stdin)"
    elif program.startswith("/"):
        what = f"runs '{program}', a program of the machine and not code of {folder}"
    else:
        what = f"runs '{program}', a program found on PATH and not code of {folder}"
    fix = (f'command = ["./{program}"] (a program of the folder)' if program in connector.files else
           f'add the code to {folder} (e.g. main.py) and run it: command = ["python3", "main.py"]')
    yield Finding(
        "N012",
        file,
        snapshot.line_of(file, "run", "command", code.index),
        f"[run] {what}: a connector's code lives in its folder, where review and its sandbox see it",
        f"a program of {folder} (./server), or a runtime (python3, node, sh) running a script of it",
        fix,
    )


def _check_own(snapshot: Snapshot, connector: Connector, index: int, arg: str) -> Iterator[Finding]:
    """N007, N012: `arg`, a program or script `[run]` runs, is a file of the connector's folder."""
    file = f"{connector.folder}/connector.toml"
    name = posixpath.normpath(arg)
    if arg.startswith("/") or name == ".." or name.startswith("../"):
        base = arg.rstrip("/").rsplit("/", 1)[-1] or "main.py"
        yield Finding(
            "N012",
            file,
            snapshot.line_of(file, "run", "command", index),
            f"[run] runs '{arg}', outside {connector.folder}: a connector's code lives in its folder, where "
            "review and its sandbox see it",
            "a program or script of the connector's folder, named relative to it",
            f"copy it into {connector.folder}/ and name it relatively (e.g. '{base}')",
        )
    elif name not in connector.files and not any(f.startswith(f"{name}/") for f in connector.files):
        yield Finding(
            "N007",
            file,
            snapshot.line_of(file, "run", "command", index),
            f"[run] runs '{arg}', which is not in {connector.folder}: a manifest without code is a stub"
            f"{suggest(name, sorted(connector.files)).did_you_mean}",
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
    command = connector.spec.run.command or ()
    code = _code_of(command) if command else None
    for i, arg in enumerate(command):
        if i == 0 or not arg.startswith("/") or arg.startswith(_SYSTEM_FOLDERS):
            continue
        if code is not None and code.kind == "script" and code.index == i:  # N012: the code is not its folder's
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
    machine. Any other bare name (`node`, `python3.12`) would be found, or not, on whatever PATH runs it.
    A program that is no runtime is N012's: it runs no code of the folder."""
    command = connector.spec.run.command
    if not command:
        return
    program = command[0]
    needs = connector.spec.needs
    if "/" in program or program in PYTHON_RUNTIMES or program in needs.programs or _runtime_of(program) is None:
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
            for i, pattern in enumerate(given.drop):
                yield from _check_pattern(snapshot, file, pattern, (*at, "drop", i))
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
    """N009: an error's `match` (or a `drop` entry) compiles as a regular expression."""
    try:
        re.compile(pattern)
    except re.error as exc:
        dropped = "drop" in at
        literal = f"'{re.escape(pattern)}'"
        yield Finding(
            "N009",
            file,
            snapshot.line_of(file, *at),
            f"[wrap] {'drop' if dropped else 'error'} pattern {pattern!r} is not a regular expression: {exc}",
            f"a Python regular expression, searched in the server's {'text' if dropped else 'error text'}",
            f"{f'drop = [{literal}]' if dropped else f'match = {literal}'} to match the text as it is (in single "
            "quotes, TOML keeps the backslashes)",
        )
