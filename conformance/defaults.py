"""Defaults the command and the pytest plugin share, in a module that imports nothing.

The `handler` CLI imports the command's module on every run (to build its parser), so what it
needs at that point must not pull in pytest or hypothesis, which only a check uses.
"""

from __future__ import annotations

__all__ = ["DEFAULT_EXAMPLES"]

DEFAULT_EXAMPLES = 25  # valid inputs generated per tool
