"""An interface version's skill: its `skills/<folder>/SKILL.md`, read as the Agent Skills convention writes it.

A skill is Markdown opening with a front matter between two `---` lines, of which this project reads
`name` (equal to the skill's folder) and `description` (what the skill is for, in a sentence or two:
what a host shows the model before it loads the whole skill). The loader (`config.loading`) reads the
one skill of each interface version into the snapshot and reports I016 (no skill, or more than one)
and I017 (a front matter without a name or a description, or a name that is not its folder's). The
router serves it (docs/router.md "Skills"); `handler mcp-config --skills` writes it where a host
loads skills (docs/hosts.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.config.findings import Finding

__all__ = ["SKILL_FILE", "Skill", "host_skill_name", "read_skill", "renamed_skill", "skill_uri"]

SKILL_FILE = "SKILL.md"
MOST_DESCRIPTION = 1024  # the Agent Skills convention's bound, which hosts enforce
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*):(.*)$")
_NOT_NAME = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class Skill:
    """The skill of one interface version, e.g. ocr/v1's `skills/ocr/SKILL.md`."""

    folder: str  # its folder under skills/
    path: str  # in the tree: catalog/interfaces/ocr/v1/skills/ocr/SKILL.md
    description: str  # its front matter's, on one line
    text: str  # the whole SKILL.md, as the interface holds it


def skill_uri(key: str) -> str:
    """The stable address of interface version `key`'s skill as a resource: ocr/v1 → handler://skills/ocr/v1."""
    return f"handler://skills/{key}"


def host_skill_name(name: str, version: int) -> str:
    """The folder (and front-matter name) a host loads interface `name` version `version`'s skill under: its name in
    lowercase letters, digits and hyphens, then `-v<N>` (web-search, 1 → web-search-v1), so two versions of one
    interface never share a folder, and the name keeps within the convention's 64 characters."""
    base = _NOT_NAME.sub("-", name.lower()).strip("-")[:58] or "interface"
    return f"{base}-v{version}"


def renamed_skill(text: str, name: str) -> str:
    """`text` (a SKILL.md) with its front matter's `name` set to `name`; every other byte as it was."""
    lines = text.split("\n")
    end = _front_matter_end(lines)
    for index in range(1, end if end is not None else 1):
        if lines[index].startswith("name:"):
            lines[index] = f"name: {name}"
            return "\n".join(lines)
    return text


def read_skill(where: str, files: Mapping[str, bytes]) -> tuple[Skill | None, list[Finding]]:
    """The skill among an interface version's `files` (path in its folder → bytes), and I016/I017 findings.

    `where` is the version's folder in the tree (catalog/interfaces/ocr/v1).
    """
    found = sorted(p for p in files if p.startswith("skills/") and p.count("/") == 2 and p.endswith("/" + SKILL_FILE))
    if len(found) != 1:
        return None, [_count_finding(where, found)]
    path = found[0]
    folder = path.split("/")[1]
    try:
        text = files[path].decode()
    except UnicodeDecodeError:
        return None, [_front_finding(f"{where}/{path}", 1, " is not UTF-8 text")]
    front, problem = _front_matter(text)
    if problem is not None:
        return None, [_front_finding(f"{where}/{path}", 1, problem)]
    name, description = front.get("name", (1, "")), front.get("description", (1, ""))
    if name[1] != folder:
        said = f"names '{name[1]}'" if name[1] else "names nothing"
        return None, [_front_finding(f"{where}/{path}", name[0], f"'s front matter {said}, not its folder '{folder}'")]
    if not description[1] or len(description[1]) > MOST_DESCRIPTION:
        said = "no description" if not description[1] else f"a description of {len(description[1])} characters"
        return None, [_front_finding(f"{where}/{path}", description[0], f"'s front matter has {said}")]
    return Skill(folder, f"{where}/{path}", description[1], text), []


def _front_matter_end(lines: list[str]) -> int | None:
    """The index of the `---` line that closes the front matter, or None when the text opens with none."""
    if not lines or lines[0].rstrip() != "---":
        return None
    return next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)


def _front_matter(text: str) -> tuple[dict[str, tuple[int, str]], str | None]:
    """The front matter's top-level keys (key → (line, value on one line)), or what is wrong with it.

    Plain, quoted and folded (`>`, `|`) values are read; the convention's other keys are kept as they are."""
    lines = text.split("\n")
    end = _front_matter_end(lines)
    if end is None:
        return {}, " does not open with a front matter between two '---' lines"
    keys: dict[str, tuple[int, str]] = {}
    current: str | None = None
    for index in range(1, end):
        line = lines[index]
        match = _KEY.match(line)
        if match:
            current = match[1]
            keys[current] = (index + 1, _unquoted(match[2].strip()))
        elif current is not None and line[:1] in (" ", "\t") and line.strip():
            at, value = keys[current]
            value = "" if value in (">", "|", ">-", "|-") else value
            keys[current] = (at, f"{value} {line.strip()}".strip())
    return keys, None


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _count_finding(where: str, found: list[str]) -> Finding:
    """I016: no skill, or more than one."""
    name = where.rsplit("/", 2)[-2]
    if not found:
        return Finding("I016", f"{where}/interface.toml", 1, f"interface version {where.split('/', 2)[2]} has no "
                       "skill: the model would get its tools and no word on when to call them or what each result "
                       "asks of it", f"{where}/skills/<folder>/SKILL.md, its front matter naming the folder and "
                       "describing the interface", f"add {where}/skills/{name}/SKILL.md opening with '---', "
                       f"'name: {name}', 'description: ...', '---'")
    return Finding("I016", f"{where}/{found[1]}", 1, f"interface version {where.split('/', 2)[2]} has "
                   f"{len(found)} skills ({', '.join(p.split('/')[1] for p in found)}); the router serves one",
                   f"one skill under {where}/skills/", "merge them into one SKILL.md and remove the others")


def _front_finding(path: str, line: int, problem: str) -> Finding:
    """I017: a skill whose front matter does not say its name and description."""
    folder = path.rsplit("/", 2)[-2]
    return Finding("I017", path, line, f"the skill{problem}; hosts load a skill by its front matter's name and "
                   "show the model its description", "a front matter between two '---' lines with 'name' equal to the "
                   f"skill's folder and a 'description' of 1 to {MOST_DESCRIPTION} characters",
                   f"open the file with '---', 'name: {folder}', 'description: what it is for and when to use it', "
                   "'---'")
