"""What the `handler` commands share: exit codes, reading the tree at ROOT, and printing findings.

Called by the command modules of `reconciler.cli` only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reconciler.config import Snapshot
    from reconciler.config.findings import Finding

__all__ = ["EXIT_FINDINGS", "EXIT_OK", "EXIT_USAGE", "load_tree", "print_findings"]

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def load_tree(root: str) -> Snapshot:
    """The config tree at `root`, loaded and checked; SourceError when `root` holds none."""
    from reconciler.config import FolderSource, Loader, SourceError  # loaded when used: `handler call` starts fast

    if not Path(root, "config").is_dir() and not Path(root, "catalog").is_dir():
        raise SourceError(f"{root} holds neither config/ nor catalog/; give the root of a config tree")
    return Loader().load(FolderSource(root))


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
