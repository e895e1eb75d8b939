"""What a profile selects, itself or through the org's defaults, exists and fits: its services
(an interface, a version, a binding whose connector implements it) and its template.

Who wrote the missing name decides the code: a profile's own entry is a P-finding, an org default
an O006. `_CODES` is the one place those codes are given. P001-P003, P007, P010, P011, O006.
Run by `check_tree` for each profile (resolving it with `config.resolving`), and by `profiles` and
`org` for the template each names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from reconciler.config.findings import Finding, suggest
from reconciler.config.lines import KeyPath
from reconciler.config.resolving import Miss, Twice, origin_of, resolve_profile
from reconciler.config.snapshot import Profile, Snapshot

__all__ = ["check_selections", "check_template"]

# (what is missing, who named it: see `origin_of`) → the finding's code.
_CODES: Mapping[tuple[str, str], str] = {
    ("interface", "profile"): "P010",
    ("version", "profile"): "P010",
    ("binding", "profile"): "P001",
    ("template", "profile"): "P007",
    ("interface", "org default"): "O006",
    ("version", "org default"): "O006",
    ("binding", "org default"): "O006",
    ("template", "org default"): "O006",
    ("connector binding", "profile"): "P011",
    ("connector binding", "org default"): "P011",
    ("implementation", "profile"): "P002",
    ("implementation", "org default"): "P002",
}


def _finding(missing: str, file: str, line: int, message: str, expected: str, fix: str) -> Finding:
    return Finding(_CODES[missing, origin_of(file)], file, line, message, expected, fix)


def check_selections(snapshot: Snapshot, profile: Profile) -> tuple[Profile, list[Finding]]:
    """The profile with its selections resolved, and a finding for each one that failed.

    A broken org default yields the same finding for every profile that falls back to it; the
    caller keeps one per place.
    """
    resolution = resolve_profile(snapshot, profile)
    findings = [_selected_twice(snapshot, twice) for twice in resolution.twice]
    findings.extend(_unresolved(snapshot, miss) for miss in resolution.misses)
    return resolution.profile, findings


def check_template(snapshot: Snapshot, file: str, at: KeyPath, template: str | None) -> Iterator[Finding]:
    """The template a profile (`template`) or the org (`[defaults] template`) names exists."""
    if template is None or template in snapshot.templates:
        return
    hint = suggest(template, sorted(snapshot.templates))
    by_profile = origin_of(file) == "profile"
    yield _finding(
        "template",
        file,
        snapshot.line_of(file, *at),
        f"{'' if by_profile else 'default '}template '{template}' does not exist{hint.did_you_mean}",
        hint.one_of,
        "correct it or add config/templates/<name>.toml" if by_profile else "correct the name",
    )


def _selected_twice(snapshot: Snapshot, twice: Twice) -> Finding:
    first, again = twice.first.key, twice.again.key
    return Finding(
        "P003",
        twice.again.file,
        snapshot.line_of(twice.again.file, *twice.again.at),
        f"interface '{twice.again.interface}' is selected twice ('{first}' and '{again}')",
        "one binding per interface in a profile",
        f"keep one of the keys '{first}' and '{again}'",
    )


def _unresolved(snapshot: Snapshot, miss: Miss) -> Finding:
    choice = miss.choice
    iface, key, binding, file = choice.interface, choice.key, choice.binding, choice.file
    line = snapshot.line_of(file, *choice.at)  # looked up only for a finding: scanning costs more than parsing
    if miss.missing == "interface":
        hint = suggest(iface, sorted(snapshot.interface_versions))
        message = f"'{key}' names no interface{hint.did_you_mean}"
        fix = "correct the key or add the interface to the catalog"
        return _finding(miss.missing, file, line, message, hint.one_of, fix)
    if miss.missing == "version":
        versions = suggest(key, [f"{iface}/v{v}" for v in snapshot.versions_of(iface)]).one_of
        fix = f"select '{iface}' (the highest version) or {versions}"
        return _finding(miss.missing, file, line, f"interface version '{key}' does not exist", versions, fix)
    if miss.missing == "binding":
        path = f"config/bindings/{binding}.toml"
        if path in snapshot.documents or any(f.file == path for f in snapshot.findings):
            message = f"binding '{binding}' cannot be selected: {path} has errors of its own (its findings say which)"
            return _finding(miss.missing, file, line, message, "a binding whose file loads without errors",
                            f"fix {path}")
        message = f"binding '{binding}' does not exist{suggest(binding, snapshot.bindings).did_you_mean}"
        expected = "the name of a file in config/bindings/ (without .toml)"
        fix = f"create {path} or name an existing binding"
        return _finding(miss.missing, file, line, message, expected, fix)
    if miss.missing == "connector binding":
        message = f"binding '{binding}' is not a connector binding (it names an addon)"
        expected, fix = 'a binding with connector = "..."', "select a connector binding"
        return _finding(miss.missing, file, line, message, expected, fix)
    implements = ", ".join(miss.implements) or "nothing"
    message = f"binding '{binding}' runs connector '{miss.connector}', which does not implement '{key}'"
    expected = f"a binding whose connector implements {key} (it implements: {implements})"
    fix = f"select a binding of a connector that implements {key}"
    return _finding(miss.missing, file, line, message, expected, fix)
