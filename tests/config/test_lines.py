"""The line of each key, as findings point at it: past strings of every TOML kind, escapes and quotes."""

from __future__ import annotations

import json
import tomllib

from reconciler.config.lines import json_key_lines, toml_key_lines

TOML = "\n".join([
    r'a = "plain"',
    r'b = "an \"escaped\" quote and a backslash \\"',
    r"c = 'literal \ with a backslash'",
    r'd = """',
    r'multi-line with "quotes" and \""" inside',
    r'"""',
    r'e = """ends in a quote""""',
    r"f = '''",
    r"literal",
    r"multi-line'''",
    r"[t]",
    r'g = "after \n an escape"',
    "",
])

JSON = r'''{
  "a": "x \" y",
  "b": {
    "c": "\\",
    "d": "a \"b\": c"
  }
}'''


def test_each_key_is_on_its_line_past_strings_of_every_kind() -> None:
    assert tomllib.loads(TOML)["e"] == 'ends in a quote"'  # what the scanner reads is valid TOML
    lines = toml_key_lines(TOML)
    assert {k: v for k, v in lines.items() if len(k) == 1} == {
        ("a",): 1, ("b",): 2, ("c",): 3, ("d",): 4, ("e",): 7, ("f",): 8, ("t",): 11}
    assert lines[("t", "g")] == 12


def test_json_keys_after_escaped_quotes() -> None:
    assert json.loads(JSON)["b"]["d"] == 'a "b": c'
    lines = json_key_lines(JSON)
    assert (lines[("a",)], lines[("b",)], lines[("b", "c")], lines[("b", "d")]) == (2, 3, 4, 5)
    assert ("b", "d", "c") not in lines  # a key-like text inside a string is not a key
