"""What the tree's file listing shows: a file nothing reads (F005), a symbolic link (F006), a name that is not
UTF-8 (F008), a file too large to read (F009), a version
folder lacking one of the two files every interface version has (I014). The loader asks as it sorts
the files.
"""

from __future__ import annotations

from reconciler.config.findings import Finding

__all__ = ["linked_file", "missing_file", "oversize_file", "stray_file", "undecodable_file", "undecodable_name"]


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


def linked_file(path: str, target: bytes) -> Finding:
    """F006: `path` is a symbolic link (to `target`), which the tree's sources never follow."""
    return Finding(
        "F006",
        path,
        1,
        f"this is a symbolic link (to {target.decode(errors='replace')}), and links in a config tree are not "
        "followed: a tree holds its files itself, as git stores them",
        "a file or folder of the tree itself",
        "replace the link with a copy of what it points to (or remove it)",
    )


def undecodable_name(path: str) -> str | None:
    """`path` with the bytes that are not UTF-8 written as escapes (`bad\\xff`), or None when it is UTF-8."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return path.encode(errors="surrogateescape").decode(errors="backslashreplace")
    return None


def undecodable_file(escaped: str) -> Finding:
    """F008: a file's name (`escaped`, see `undecodable_name`) is not UTF-8; the file is not read."""
    return Finding(
        "F008",
        escaped,
        1,
        "this file's name is not UTF-8 (its other bytes are shown as \\x escapes), and the file is not read",
        "file names in UTF-8, as every tool that shows the tree reads them",
        "rename the file (git mv) to a UTF-8 name, or remove it",
    )


def oversize_file(path: str, size: int, most: int) -> Finding:
    """F009: a file over the `most` bytes a file of the tree may hold; it is not read."""
    return Finding(
        "F009",
        path,
        1,
        f"this file holds {size:,} bytes, over the {most:,} a file of the config tree may hold; it is not read",
        f"files of at most {most // (1024 * 1024)} MiB (a model or a dataset belongs in [needs], fetched at install)",
        "remove the file from the tree (git rm), or fetch it when the connector is installed",
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
