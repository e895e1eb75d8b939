"""What the tree's file listing shows: a file nothing reads (F005), a version folder lacking one of
the two files every interface version has (I014). The loader asks as it sorts the files.
"""

from __future__ import annotations

from reconciler.config.findings import Finding

__all__ = ["missing_file", "stray_file"]


def stray_file(path: str) -> Finding:
    """F005: `path`, outside catalog/, is not a file of any config kind."""
    return Finding(
        "F005",
        path,
        1,
        "this file is not part of any config kind and is ignored",
        "config/org.toml, config/bindings/*.toml, config/profiles/*.toml or config/templates/*.toml",
        "move or remove the file",
    )


def missing_file(name: str, folder: str, missing: str) -> Finding:
    """I014: interface version `name`/`folder` has no `missing` (interface.toml or tools.json)."""
    where = f"catalog/interfaces/{name}/{folder}"
    return Finding(
        "I014",
        f"{where}/{missing}",
        1,
        f"interface version {name}/{folder} has no {missing}",
        "interface.toml and tools.json in every version folder",
        f"add {where}/{missing}",
    )
