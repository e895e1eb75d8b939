"""Where each key of a TOML or JSON document sits: a map from key path to line number.

Documents are parsed by tomllib and orjson (fast, strict); these scanners run only on text that
already parsed, and only when a finding needs a line, so they can stay small and lenient. A key path
is a tuple of keys and array indexes, e.g. ("secrets", "api_key") or (0, "inputSchema", "properties").
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["KeyPath", "json_key_lines", "toml_key_lines"]

KeyPath = tuple[str | int, ...]


class _Scanner:
    """Character scanner shared by both formats: positions, line numbers, strings and spaces."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.lines: dict[KeyPath, int] = {}

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def advance(self, n: int = 1) -> None:
        chunk = self.text[self.pos : self.pos + n]
        self.line += chunk.count("\n")
        self.pos += n

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def skip_space(self, *, newlines: bool = True, comments: bool = False) -> None:
        while not self.at_end():
            c = self.text[self.pos]
            if c in " \t\r" or (newlines and c == "\n"):
                self.advance()
            elif comments and c == "#":
                end = self.text.find("\n", self.pos)
                self.advance((len(self.text) if end < 0 else end) - self.pos)
            else:
                return

    def read_quoted(self) -> str:
        """Read a quoted string (TOML basic, literal or multi-line; JSON) and return its raw body."""
        for quote in ('"""', "'''", '"', "'"):
            if self.peek(len(quote)) == quote:
                break
        self.advance(len(quote))
        start = self.pos
        escapes = not quote.startswith("'")
        while True:  # from one quote or backslash to the next: a long string is a few finds, not a loop a character
            end = self.text.find(quote, self.pos)
            escape = self.text.find("\\", self.pos, None if end < 0 else end) if escapes else -1
            if escape >= 0:
                self.advance(escape + 2 - self.pos)
                continue
            if end < 0:
                self.advance(len(self.text) - self.pos)
                return self.text[start:]
            self.advance(end - self.pos)
            body = self.text[start : self.pos]
            self.advance(len(quote))
            # A multi-line string may close with extra quotes (up to two): they belong to it.
            while len(quote) == 3 and self.peek() == quote[0]:
                self.advance()
            return _unescape(body) if escapes else body

    def record(self, path: KeyPath, line: int) -> None:
        # [members.alice] or a.b = 1 also opens its parents: they sit on this line unless seen before.
        for end in range(1, len(path) + 1):
            self.lines.setdefault(path[:end], line)


def _unescape(body: str) -> str:
    if "\\" not in body:
        return body
    import json

    try:
        value = json.loads(f'"{body}"')
    except ValueError:
        return body
    return value if isinstance(value, str) else body


# --- TOML ---------------------------------------------------------------------------------------

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def toml_key_lines(text: str) -> dict[KeyPath, int]:
    """Map every key, table and array-of-tables entry of a valid TOML document to its line."""
    s = _Scanner(text)
    prefix: KeyPath = ()
    counters: dict[KeyPath, int] = {}
    while True:
        s.skip_space(comments=True)
        if s.at_end():
            return s.lines
        line = s.line
        if s.peek(2) == "[[":
            s.advance(2)
            key = _toml_dotted_key(s, "]")
            s.advance(2)
            index = counters.get(key, -1) + 1
            counters[key] = index
            # Tables nested under this entry restart their own counts.
            for k in [k for k in counters if len(k) > len(key) and k[: len(key)] == key]:
                del counters[k]
            prefix = (*key, index)
            s.record(key, line)
            s.record(prefix, line)
        elif s.peek() == "[":
            s.advance()
            key = _toml_dotted_key(s, "]")
            s.advance()
            prefix = _resolve_array_tables(key, counters)
            s.record(prefix, line)
        else:
            key = _toml_dotted_key(s, "=")
            s.advance()
            path = (*prefix, *key)
            s.record(path, line)
            _toml_value(s, path)


def _resolve_array_tables(key: KeyPath, counters: dict[KeyPath, int]) -> KeyPath:
    """[a.b] under [[a]] means the current entry of a: insert its index."""
    out: list[str | int] = []
    for part in key:
        out.append(part)
        index = counters.get(tuple(out))
        if index is not None:
            out.append(index)
    return tuple(out)


def _toml_dotted_key(s: _Scanner, stop: str) -> KeyPath:
    parts: list[str | int] = []
    while not s.at_end():
        s.skip_space(newlines=False)
        c = s.peek()
        if c in "\"'":
            parts.append(s.read_quoted())
        elif c == ".":
            s.advance()
        elif c in (stop, "\n"):
            return tuple(parts)
        else:
            start = s.pos
            while not s.at_end() and s.text[s.pos] in _BARE:
                s.advance()
            if s.pos == start:  # not a key character: step over it rather than loop
                s.advance()
                continue
            parts.append(s.text[start : s.pos])
    return tuple(parts)


def _toml_value(s: _Scanner, path: KeyPath) -> None:
    s.skip_space(newlines=False)
    c = s.peek()
    if c in "\"'":
        s.read_quoted()
    elif c == "{":
        s.advance()
        while True:
            s.skip_space(comments=True)
            if s.peek() in ("}", ""):
                s.advance()
                return
            if s.peek() == ",":
                s.advance()
                continue
            line = s.line
            key = _toml_dotted_key(s, "=")
            s.advance()
            inner = (*path, *key)
            s.record(inner, line)
            _toml_value(s, inner)
    elif c == "[":
        s.advance()
        index = 0
        while True:
            s.skip_space(comments=True)
            if s.peek() in ("]", ""):
                s.advance()
                return
            if s.peek() == ",":
                s.advance()
                continue
            item = (*path, index)
            s.record(item, s.line)
            _toml_value(s, item)
            index += 1
    else:
        while not s.at_end() and s.text[s.pos] not in ",]}\n#":
            s.advance()


# --- JSON ---------------------------------------------------------------------------------------


def json_key_lines(text: str) -> dict[KeyPath, int]:
    """Map every object key and array item of a valid JSON document to its line."""
    s = _Scanner(text)
    s.skip_space()
    s.record((), s.line)
    _json_value(s, ())
    return s.lines


def _json_value(s: _Scanner, path: KeyPath) -> None:
    s.skip_space()
    c = s.peek()
    if c == "{":
        _json_container(s, "}", lambda i: _json_member(s, path))
    elif c == "[":
        _json_container(s, "]", lambda i: _json_item(s, path, i))
    elif c == '"':
        s.read_quoted()
    else:
        while not s.at_end() and s.text[s.pos] not in ",]} \t\r\n":
            s.advance()


def _json_container(s: _Scanner, close: str, each: Callable[[int], None]) -> None:
    s.advance()
    index = 0
    while True:
        s.skip_space()
        if s.peek() in (close, ""):
            s.advance()
            return
        if s.peek() == ",":
            s.advance()
            continue
        each(index)
        index += 1


def _json_member(s: _Scanner, path: KeyPath) -> None:
    line = s.line
    key = s.read_quoted()
    s.skip_space()
    s.advance()  # the colon
    s.record((*path, key), line)
    _json_value(s, (*path, key))


def _json_item(s: _Scanner, path: KeyPath, index: int) -> None:
    s.skip_space()
    s.record((*path, index), s.line)
    _json_value(s, (*path, index))
