"""Editing the config tree: a change to its TOML files, checked on the tree as it would be before anything is written.

`handler binding create` and `handler profile use` and the dashboard's forms go through here, so a change
reads the same whoever makes it. Each edit is a pure function from the tree's files to a `Change`
(tree-relative path → new text): tomlkit keeps every comment and the order of keys of a file it edits.
`check_edit` reads a source, makes the edit and `check_change` loads the tree with the change laid over
it, runs every save-time check and plans it against the tree as it is; the caller writes the files
(`write_change`), or commits them to a branch, only when `Checked.ok` (docs/config.md, "Editing from the
command line").

A secret is only ever a reference (`env`, `file` or `command`), never a value: `secret_reference` refuses
anything else, and the dashboard allows it `env` and `file` alone (`FORM_SECRET_KINDS`).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
from pydantic import ValidationError
from tomlkit.items import InlineTable, Table
from tomlkit.toml_document import TOMLDocument

from reconciler.config.errors import HandlerError
from reconciler.config.findings import Finding
from reconciler.config.loading import Loader
from reconciler.config.models import SecretRef
from reconciler.config.planning import Plan, plan_changes, toml_value
from reconciler.config.snapshot import Snapshot
from reconciler.config.sources import TREE_FOLDERS, Blob, TreeSource, blob_sha, path_prefixes, tree_revision

__all__ = [
    "FORM_SECRET_KINDS",
    "SECRET_KINDS",
    "Change",
    "Checked",
    "Edit",
    "EditError",
    "check_change",
    "check_edit",
    "create_binding",
    "parse_secret",
    "parse_setting",
    "parse_use",
    "profile_document",
    "reference_warnings",
    "secret_reference",
    "use_bindings",
    "valid_name",
    "write_change",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SECRET_KINDS = ("env", "file", "command")
# A form in a browser names where a secret is, never how to compute it: a `command` reference runs in the
# router, unconfined, so it comes only by the command line or a pull request (docs/architecture.md §8).
FORM_SECRET_KINDS = ("env", "file")


class EditError(HandlerError):
    """The change asked for cannot be made at all (a malformed argument, a file that exists or is missing)."""


@dataclass(frozen=True)
class Change:
    """New text for some files of the tree, and one line saying what the change does (a commit's subject)."""

    files: Mapping[str, str]  # tree-relative path → the file's whole new text
    summary: str


@dataclass(frozen=True)
class Checked:
    """A change with the tree before and after it, the findings that keep it out and the plan it makes."""

    change: Change
    before: Snapshot
    after: Snapshot
    plan: Plan

    @property
    def errors(self) -> tuple[Finding, ...]:
        """Every error of the tree as it would be: the service would refuse to apply it."""
        return self.after.errors

    @property
    def new_findings(self) -> tuple[Finding, ...]:
        """The findings the change brings (those of the tree before it left out)."""
        old = {_identity(f) for f in self.before.findings}
        return tuple(f for f in self.after.findings if _identity(f) not in old)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def brought_errors(self) -> tuple[Finding, ...]:
        """The errors the change itself brings: what to fix in it."""
        return tuple(f for f in self.new_findings if f.is_error)

    @property
    def standing_errors(self) -> tuple[Finding, ...]:
        """The errors the tree had before the change and still has: they keep it out all the same."""
        brought = set(self.brought_errors)
        return tuple(f for f in self.errors if f not in brought)


def _identity(finding: Finding) -> tuple[str, str, str]:
    """A finding without its line: an edit moves lines, not what is wrong."""
    return finding.code, finding.file, finding.message


# --- arguments -------------------------------------------------------------------------------------


def parse_secret(text: str) -> tuple[str, dict[str, Any]]:
    """`SLOT=env:VAR`, `SLOT=file:PATH` or `SLOT=command:ARGV` → (slot, its reference); a value is refused."""
    slot, sep, ref = text.partition("=")
    kind, colon, target = ref.partition(":")
    if not sep or not _NAME.match(slot):
        raise EditError(f"--secret {text!r} is not SLOT=REFERENCE; e.g. --secret api_key=env:BRAVE_API_KEY")
    if not colon or kind not in SECRET_KINDS or not target:
        raise EditError(f"--secret {slot}=...: a secret is given by reference, never by value; write "
                        f"{slot}=env:VARIABLE, {slot}=file:PATH or {slot}=command:'pass show NAME'")
    return slot, secret_reference(slot, kind, target)


def secret_reference(slot: str, kind: str, target: str, kinds: Sequence[str] = SECRET_KINDS) -> dict[str, Any]:
    """The reference `{kind = target}` for `slot`, as a binding file writes it; EditError for a kind not in
    `kinds`, an empty target, or a reference that could never name a secret (`models.SecretRef`: a command
    without a program, an environment variable that is not a name). Never given a value: a form or an
    argument names where the secret is, and this says so when it is anything else."""
    if not _NAME.match(slot):
        raise EditError(f"secret slot {slot!r}: a slot's name is letters, digits, '.', '_' and '-' (the connector's "
                        "secretSlots name them)")
    if kind not in kinds:
        allowed = " or ".join(kinds)
        if kind == "command" and "command" not in kinds:
            raise EditError(f"secret {slot}: a command reference runs in the router, so it is not taken here; "
                            f"give an {allowed} reference, or write the command with `handler binding create "
                            "--secret` in a pull request")
        raise EditError(f"secret {slot}: {kind!r} is not a kind of reference; give {allowed}")
    target = target.strip()
    if not target:
        raise EditError(f"secret {slot}: name the {'variable' if kind == 'env' else kind} it is read from")
    if kind == "command":
        try:
            reference: dict[str, Any] = {"command": shlex.split(target)}
        except ValueError as exc:
            raise EditError(f"--secret {slot}=command:...: {exc}; quote the command as a shell would") from exc
    else:
        reference = {kind: target}
    try:  # what a binding file may hold, by the model's own rules; its message never repeats what was given
        SecretRef.model_validate(reference)
    except ValidationError as exc:
        raise EditError(f"secret {slot}: {exc.errors()[0]['msg']}") from None
    return reference


def reference_warnings(slot: str, reference: Mapping[str, Any], root: Path,
                       env: Mapping[str, str] | None = None) -> list[str]:
    """What this machine says of where `reference` points, before it is written: a file that does not exist here or
    that other users may read, and, given the service's own `env`, a variable it lacks. Warnings, not errors: in
    git mode the service runs elsewhere, and a file may be put in place after the pull request."""
    said: list[str] = []
    if isinstance(reference.get("file"), str):
        path = Path(reference["file"]).expanduser()
        path = path if path.is_absolute() else root / path
        try:
            mode = path.stat().st_mode
        except OSError:
            said.append(f"secret {slot}: there is no file {path} on this machine; the connector cannot start until "
                        "the service can read it")
        else:
            if mode & stat.S_IROTH:
                said.append(f"secret {slot}: {path} is readable by every user of this machine; make it readable by "
                            f"the service alone (chmod 600 {path})")
    if env is not None and isinstance(reference.get("env"), str) and reference["env"] not in env:
        said.append(f"secret {slot}: the running service's environment has no {reference['env']}; set it where the "
                    "service starts (its unit's Environment=, or the shell that runs handler up) and restart it")
    return said


def parse_setting(text: str) -> tuple[str, str]:
    """`KEY=VALUE` → (key, value); the value stays a string, as the connector reads it from its environment."""
    key, sep, value = text.partition("=")
    if not sep or not _NAME.match(key):
        raise EditError(f"--setting {text!r} is not KEY=VALUE; e.g. --setting country=FR")
    return key, value


def parse_use(text: str) -> tuple[str, str]:
    """`INTERFACE=BINDING` (the interface as `ocr` or `ocr/v1`) → (interface, binding)."""
    interface, sep, binding = text.partition("=")
    name, slash, version = interface.partition("/")
    if not sep or not _NAME.match(name) or not _NAME.match(binding) or (slash and not re.fullmatch(r"v\d+", version)):
        raise EditError(f"{text!r} is not INTERFACE=BINDING; e.g. ocr=ocr-local or ocr/v1=ocr-local")
    return interface, binding


# --- edits -----------------------------------------------------------------------------------------


def create_binding(files: Mapping[str, Blob], name: str, connector: str, *, description: str = "",
                   secrets: Mapping[str, Mapping[str, Any]] | None = None,
                   settings: Mapping[str, str] | None = None) -> Change:
    """A new `config/bindings/NAME.toml` of `connector`; EditError when that binding exists."""
    valid_name(name, "binding", "config/bindings/NAME.toml")
    path = f"config/bindings/{name}.toml"
    if path in files:
        raise EditError(f"binding {name} exists ({path}); choose another name, or edit that file")
    doc = tomlkit.document()
    doc["apiVersion"] = "handler.binding/v1"
    doc["name"] = name
    doc["connector"] = connector
    if description:
        doc["description"] = description
    if secrets:
        doc["secrets"] = _inline(dict(secrets))
    if settings:
        doc["settings"] = _inline(dict(settings))
    return Change({path: _ended(doc.as_string())}, f"Add binding {name} of connector {connector}")


def use_bindings(files: Mapping[str, Blob], profile: str, uses: Sequence[tuple[str, str]]) -> Change:
    """`config/profiles/PROFILE.toml` with each (interface, binding) set in its `services`, all else kept.

    An interface the profile already selects keeps its key (and so its pinned version, `"ocr/v1"`)
    unless the version is given, and its key stays where it stands, with its comment; a new one is added
    at the end of `services`, whether an inline table, a `[services]` table or dotted `services.x` keys.
    """
    path, doc = profile_document(files, profile)
    # A [services] table, or the tables of dotted keys (one for each `services.x = ...`): edited in place.
    tables = [item for key, item in doc.body if key is not None and key.key == "services" and isinstance(item, Table)]
    services = doc.get("services")
    if tables:
        for interface, binding in uses:
            _select_in(tables, interface, binding)
    elif services is None or isinstance(services, InlineTable):  # an inline table is written anew, as one
        chosen: dict[str, Any] = dict(services or {})
        for interface, binding in uses:
            chosen = _select(chosen, interface, binding)
        doc["services"] = _inline(chosen)
    else:
        raise EditError(f"{path}: services is not a table; `handler validate` shows where")
    what = ", ".join(f"{i} → {b}" for i, b in uses)
    return Change({path: _ended(doc.as_string())}, f"Profile {profile}: {what}")


def valid_name(name: str, kind: str, file: str) -> None:
    """EditError unless `name` can name a file of the tree (`file`, e.g. config/bindings/NAME.toml)."""
    if not _NAME.match(name):
        raise EditError(f"{kind} name {name!r}: use letters, digits, '.', '_' and '-', starting with a letter "
                        f"or digit (it names the file {file})")


def profile_document(files: Mapping[str, Blob], profile: str) -> tuple[str, TOMLDocument]:
    """(the path, the parsed document) of `config/profiles/PROFILE.toml`; EditError when it is missing, a link or
    does not parse, naming the profiles there are."""
    path = f"config/profiles/{profile}.toml"
    link = next((files[p] for p in path_prefixes(path) if p in files and files[p].link), None)
    if link is not None:  # its data is the link's target: the tree never follows it, so neither does an edit
        raise EditError(f"{link.path} is a symbolic link (to {link.data.decode(errors='replace')}), and links in a "
                        "config tree are not followed (F006); replace it with a copy of what it points to")
    blob = files.get(path)
    if blob is None:
        known = sorted(p.removeprefix("config/profiles/").removesuffix(".toml")
                       for p in files if p.startswith("config/profiles/"))
        raise EditError(f"no profile {profile} ({path} does not exist); profiles: {', '.join(known) or '(none)'}")
    try:
        return path, tomlkit.parse(blob.data.decode("utf-8"))
    except (UnicodeDecodeError, tomlkit.exceptions.ParseError) as exc:
        raise EditError(f"{path} cannot be edited: {exc}; `handler validate` shows where") from exc


def _placed(keys: Sequence[str], interface: str) -> tuple[str | None, str, list[str]]:
    """Where selecting `interface` goes among the services keys `keys`: the key it takes the place of (None: a
    new key at the end), the key it is written as, and the other keys of the same interface it removes."""
    name = interface.partition("/")[0]
    same = [k for k in keys if k.partition("/")[0] == name]
    if interface in keys:
        return interface, interface, []
    if same and "/" not in interface:  # the key as it is, pinned version and all
        return same[0], same[0], []
    if same:  # another version of it: the given one replaces it where it stood
        return same[0], interface, same[1:]
    return None, interface, []


def _select(services: dict[str, Any], interface: str, binding: str) -> dict[str, Any]:
    """`services` with `interface` served by `binding`, in place of any key naming the same interface."""
    old, key, dropped = _placed(list(services), interface)
    chosen = {(key if k == old else k): (binding if k == old else v) for k, v in services.items() if k not in dropped}
    return chosen if old is not None else {**chosen, key: binding}


def _select_in(tables: Sequence[Table], interface: str, binding: str) -> None:
    """`_select` in the tables that hold the services keys, each key edited where it stands."""
    old, key, dropped = _placed([k for table in tables for k in table], interface)
    for gone in dropped:
        del next(t for t in tables if gone in t)[gone]
    if old is None:
        tables[-1][key] = binding
        return
    table = next(t for t in tables if old in t)
    if key == old:
        table[key] = binding
    else:  # tomlkit renames a key only by `_replace`, which its own assignment uses: place and comment are kept
        table.value._replace(old, key, tomlkit.item(binding))


def _inline(value: Mapping[str, Any]) -> InlineTable:
    """`value` as one inline table, `{ a = "x", b = { env = "Y" } }`, written as the example tree writes them."""
    table = tomlkit.parse(f"v = {toml_value(value)}")["v"]
    if not isinstance(table, InlineTable):
        raise TypeError(f"not an inline table: {table!r}")
    return table


# --- checking and writing ---------------------------------------------------------------------------

Edit = Callable[[Mapping[str, Blob]], Change]  # an edit of the tree's files: `create_binding`, `use_bindings`


class _Files:
    """A fixed set of files as a `TreeSource`."""

    def __init__(self, revision: str, files: Mapping[str, Blob]) -> None:
        self._revision, self._files = revision, dict(files)

    def read(self) -> tuple[str, dict[str, Blob]]:
        return self._revision, dict(self._files)


def check_change(revision: str, files: Mapping[str, Blob], change: Change) -> Checked:
    """The tree (`files` at `revision`, as a `TreeSource` reads it) before and after `change`, checked, and the
    plan from one to the other."""
    after_files = dict(files)
    read = tuple(f"{folder}/" for folder in TREE_FOLDERS)
    for path, text in change.files.items():
        if not path.startswith(read):  # written beside the tree (a new profile's work folder), never read as config
            continue
        data = text.encode("utf-8")
        after_files[path] = Blob(path, blob_sha(data), data)
    loader = Loader()  # one loader: what the change leaves alone loads once, and the plan skips it
    before = loader.load(_Files(revision, files))
    after = loader.load(_Files(tree_revision(after_files), after_files))
    return Checked(change, before, after, plan_changes(before, after))


def check_edit(source: TreeSource, edit: Edit) -> Checked:
    """Read `source`, make `edit` on its files and check the change (EditError when it cannot be made)."""
    revision, files = source.read()
    return check_change(revision, files, edit(files))


def write_change(root: str | os.PathLike[str], change: Change) -> list[str]:
    """Write the change's files under the config root `root`, each whole or not at all (a follower watching
    the tree never reads half a file); the tree-relative paths written."""
    for path, text in change.files.items():
        target = Path(root, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.handler-tmp")
        scratch.write_text(text, encoding="utf-8")
        scratch.replace(target)
    return sorted(change.files)


def _ended(text: str) -> str:
    """`text` ending in one newline, as every file of the tree does."""
    return text if text.endswith("\n") else text + "\n"
