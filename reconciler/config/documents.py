"""One file of the tree as read: its text, its format and, found only when asked, the line of each key.

The checks (`checks.syntax` reads a file into a `Document`) point findings at `line_of` a key path;
the snapshot keeps every document so later checks can do the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from reconciler.config.lines import KeyPath, json_key_lines, toml_key_lines

__all__ = ["Document"]


@dataclass(frozen=True, eq=False)
class Document:
    path: str
    sha: str
    text: str
    format: Literal["toml", "json"]

    @cached_property
    def lines(self) -> dict[KeyPath, int]:
        return toml_key_lines(self.text) if self.format == "toml" else json_key_lines(self.text)

    def line_of(self, *path: str | int) -> int:
        """The line of `path`, else of its closest parent that has one, else 1."""
        lines = self.lines
        key = tuple(path)
        while key:
            line = lines.get(key)
            if line is not None:
                return line
            key = key[:-1]
        return 1
