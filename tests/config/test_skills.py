"""config.skills: a SKILL.md's front matter as hosts read it, and the name a host loads it under."""

from __future__ import annotations

from reconciler.config.skills import host_skill_name, read_skill, renamed_skill, skill_uri

WHERE = "catalog/interfaces/web-search/v1"


def test_a_folded_description_is_read_on_one_line_and_other_keys_are_left_alone() -> None:
    text = "---\nname: web-search\nlicense: MIT\ndescription: >\n  Search the web,\n  then read.\n---\n# Body\n"
    skill, findings = read_skill(WHERE, {"skills/web-search/SKILL.md": text.encode()})
    assert findings == []
    assert skill is not None
    assert (skill.folder, skill.description, skill.text) == ("web-search", "Search the web, then read.", text)
    assert skill.path == f"{WHERE}/skills/web-search/SKILL.md"


def test_two_skills_are_one_too_many_and_a_file_beside_them_is_not_a_skill() -> None:
    files = {"skills/a/SKILL.md": b"---\nname: a\ndescription: A.\n---\n",
             "skills/b/SKILL.md": b"---\nname: b\ndescription: B.\n---\n", "skills/notes.md": b"x"}
    skill, findings = read_skill(WHERE, files)
    assert skill is None
    assert [(f.code, f.file) for f in findings] == [("I016", f"{WHERE}/skills/b/SKILL.md")]
    assert "has 2 skills (a, b)" in findings[0].message


def test_a_skill_without_a_front_matter_is_refused_on_its_first_line() -> None:
    skill, findings = read_skill(WHERE, {"skills/web-search/SKILL.md": b"# Web search\n"})
    assert skill is None
    assert [(f.code, f.line) for f in findings] == [("I017", 1)]
    assert "does not open with a front matter" in findings[0].message


def test_each_version_gets_a_folder_of_its_own_named_as_hosts_require() -> None:
    assert host_skill_name("web-search", 1) == "web-search-v1"
    assert host_skill_name("Web_Search", 2) == "web-search-v2"
    assert len(host_skill_name("x" * 100, 12)) <= 64
    assert skill_uri("ocr/v1") == "handler://skills/ocr/v1"


def test_renaming_touches_only_the_front_matter_name() -> None:
    text = "---\nname: ocr\ndescription: Read scans.\n---\n\nname: ocr stays in the body\n"
    assert renamed_skill(text, "ocr-v1") == text.replace("name: ocr\n", "name: ocr-v1\n", 1)
