"""What the `handler` commands share: exit codes, reading the tree at ROOT, and printing findings.

Called by the command modules of `reconciler.cli` only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.places import not_a_folder

if TYPE_CHECKING:
    from reconciler.config import Snapshot
    from reconciler.config.findings import Finding
    from reconciler.governance.store import Store

__all__ = [
    "EXIT_FINDINGS",
    "EXIT_OK",
    "EXIT_USAGE",
    "add_root_options",
    "finite_number",
    "folder_path",
    "is_tree",
    "load_tree",
    "print_findings",
    "require_tree",
    "settle_root",
    "tree_store",
]

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


_ROOT_HELP = ("the config root, the folder holding config/ and catalog/ (default: $HANDLER_ROOT, else the current "
              "folder)")


def finite_number(text: str, *, low: float, high: float, said: str) -> float:
    """`text` as a number from `low` to `high` (an argparse type's body); else an argparse error naming `said`."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise argparse.ArgumentTypeError(f"{text!r} is not {said}")
    return value


def folder_path(text: str) -> Path:
    """`text` as a folder the service keeps (an argparse type of --run-dir and --state-dir): one that is missing is
    made, but a file there or above it is refused."""
    path = Path(text)
    if (problem := not_a_folder(path)) is not None:
        raise argparse.ArgumentTypeError(f"{problem}; name a folder (a missing one is made)")
    return path


def add_root_options(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """`--root DIR` (and, where a command always took one, the positional ROOT as its alias); `settle_root`
    then puts the one given, else $HANDLER_ROOT, else '.', in `args.root`."""
    if positional:
        parser.add_argument("root", nargs="?", default=None, metavar="ROOT", help="the same as --root")
    parser.add_argument("--root", dest="root_option", metavar="DIR", help=_ROOT_HELP)
    parser.set_defaults(root=None)


def settle_root(args: argparse.Namespace) -> None:
    """`args.root` from the positional ROOT or --root (not two different ones), else $HANDLER_ROOT, else '.'."""
    from reconciler.config import SourceError

    if not hasattr(args, "root_option"):
        return
    given = [r for r in (args.root, args.root_option) if r is not None]
    if len(given) == 2 and given[0] != given[1]:
        raise SourceError(f"two config roots given ({given[0]} and --root {given[1]}); give one")
    args.root = given[0] if given else os.environ.get("HANDLER_ROOT") or "."


def is_tree(root: str) -> bool:
    """Whether `root` is the root of a config tree: it holds config/ or catalog/."""
    return Path(root, "config").is_dir() or Path(root, "catalog").is_dir()


def require_tree(root: str) -> str:
    """`root`, when it is the root of a config tree; SourceError (exit 2) naming what to give otherwise."""
    from reconciler.config import SourceError

    if not is_tree(root):
        where = "the current folder" if root == "." else root
        raise SourceError(f"{where} holds neither config/ nor catalog/: give the root of a config tree with "
                          "--root DIR (or HANDLER_ROOT)")
    return root


def load_tree(root: str) -> Snapshot:
    """The config tree at `root`, loaded and checked; SourceError when `root` holds none."""
    from reconciler.config import FolderSource, Loader  # loaded when used: `handler call` starts fast

    return Loader().load(FolderSource(require_tree(root)))


def print_findings(findings: list[Finding], fmt: str, head: Snapshot) -> None:
    """The findings as text, JSON or GitHub annotations, with a summary of the tree."""
    errors = sum(1 for f in findings if f.is_error)
    warnings = len(findings) - errors
    if fmt == "json":
        print(json.dumps({"revision": head.revision, "errors": errors, "warnings": warnings,
                          "findings": [f.to_dict() for f in findings]}, indent=2))
        return
    for f in findings:
        print(f.render_github() if fmt == "github" else f.render_text())
    summary = (
        f"{len(head.interfaces)} interface versions, {len(head.connectors)} connectors, "
        f"{len(head.bindings)} bindings, {len(head.profiles)} profiles"
    )
    if fmt == "github":
        print(f"handler validate: {errors} error(s), {warnings} warning(s) in {summary}")
    elif findings:
        print(f"\n{errors} error(s), {warnings} warning(s) in {summary}.")
    else:
        print(f"OK: {summary}; no findings.")


@contextlib.contextmanager
def tree_store(root: str, *, make: bool = False, missing: str = "nothing was recorded there (the service makes its "
               "store when it starts)") -> Iterator[Store]:
    """The store of the tree at `root` (HANDLER_STORE_URL, else SQLite in its state folder), closed after; one not
    there yet is made only with `make`, else refused (SourceError) saying where it was looked for and `missing`."""
    from reconciler.config import SourceError  # loaded when used: `handler call` starts fast
    from reconciler.governance.store import open_store, store_exists, store_url

    url = store_url(require_tree(root))
    if not make and not store_exists(url):
        raise SourceError(f"there is no store at {url}: {missing}; point HANDLER_STORE_URL or HANDLER_STATE_DIR at "
                          "the store the service uses")
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()
