"""What one file shows on its own, beyond its model's shape: names, versions, errors, egress, secrets.

One function per kind of file, run by the loader once the file's model is built (`checks.syntax`);
their findings are cached with the file's content. F003, I004, I005, I009, N002-N004, B003, B010, P013, P015.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import PurePosixPath
from typing import Any

from reconciler.config.checks.syntax import secret_example
from reconciler.config.documents import Document
from reconciler.config.findings import Finding
from reconciler.config.models import (
    MAX_NAME_CHARS,
    REFERENCE_FORMS,
    BindingFile,
    ConnectorFile,
    InterfaceFile,
    ProfileFile,
    SecretRef,
)
from reconciler.places import MAX_SOCKET_PATH, run_dir_room

__all__ = [
    "EGRESS",
    "check_binding_file",
    "check_connector_file",
    "check_interface_file",
    "check_named",
    "check_profile_file",
    "split_tool_text",
]

_SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"(\*|\[[0-9A-Fa-f:.]+\]|{_LABEL}(\.{_LABEL})*)"
# A scope that holds everything the service reads and writes: the root, a home folder or all of them.
_WHOLE_SCOPE = re.compile(r"^(/+|~[^/]*/*|/+(root|home(/+[^/]+)?|Users(/+[^/]+)?)/*)$")
EGRESS = re.compile(rf"^{_HOST}:(\*|[0-9]{{1,5}})$")


def check_named(doc: Document, spec: object, name: str) -> list[Finding]:
    """A file's `name`, when given, equals its file name, which is at most `MAX_NAME_CHARS` long (the store keeps
    names in columns of their own; a `name` given is held to it by the model)."""
    given = getattr(spec, "name", None)
    if given is None and len(name) > MAX_NAME_CHARS:
        return [Finding("F007", doc.path, 1, f"the name '{name[:40]}…', the file's, is {len(name)} characters long",
                        f"a name of at most {MAX_NAME_CHARS} characters", "rename the file")]
    if given is None or given == name:
        return []
    return [
        Finding(
            "F003",
            doc.path,
            doc.line_of("name"),
            f"name is '{given}' but the file is named '{name}'",
            "name equal to the file or folder name",
            f'name = "{name}" (or rename the file)',
        )
    ]


def check_interface_file(doc: Document, spec: InterfaceFile, where: tuple[str, str]) -> list[Finding]:
    """interface.toml: its name and folder, and its closed list of errors (S3)."""
    name, folder = where
    findings = check_named(doc, spec, name)
    if folder != f"v{spec.version}":
        findings.append(
            Finding(
                "I009",
                doc.path,
                doc.line_of("version"),
                f"version is {spec.version} but the folder is '{folder}'",
                f"the folder v{spec.version} for version = {spec.version}",
                f"move the files to catalog/interfaces/{name}/v{spec.version}/ or set the version",
            )
        )
    findings.extend(_check_errors(doc, spec))
    return findings


def _check_errors(doc: Document, spec: InterfaceFile) -> list[Finding]:
    findings: list[Finding] = []
    if not spec.errors:
        findings.append(
            Finding(
                "I004",
                doc.path,
                doc.line_of("errors"),
                f"[errors] is {'empty' if ('errors',) in doc.lines else 'missing'} (S3)",
                "a closed list of error codes, with unavailable among them",
                '[errors]\nunavailable = "the service is down or out of quota; retrying later may work"',
            )
        )
    elif "unavailable" not in spec.errors:
        findings.append(
            Finding(
                "I004",
                doc.path,
                doc.line_of("errors"),
                "[errors] lacks 'unavailable' (S3)",
                "unavailable in every interface's errors: the router returns it for outages",
                'unavailable = "the service is down or out of quota; retrying later may work"',
            )
        )
    for code in spec.errors:
        if not _SNAKE.match(code):
            words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", code)  # TooLarge → too_large
            fixed = re.sub(r"[^a-z0-9]+", "_", words.lower()).strip("_") or "error"
            findings.append(
                Finding(
                    "I005",
                    doc.path,
                    doc.line_of("errors", code),
                    f"error code '{code}' is not snake_case (S3)",
                    "lower-case words joined by '_'",
                    f"rename it to '{fixed}'",
                )
            )
    return findings


def check_connector_file(doc: Document, spec: ConnectorFile, name: str) -> list[Finding]:
    findings = check_named(doc, spec, name)
    for i, entry in enumerate(spec.egress):
        findings.extend(_check_egress(doc, ("egress", i), entry))
    run = spec.run
    if (run.command is None) == (run.builtin is None):
        what = "both a command and a builtin" if run.command else "neither a command nor a builtin"
        findings.append(
            Finding(
                "N004",
                doc.path,
                doc.line_of("run"),
                f"[run] names {what}",
                'command = [...] (with transport "stdio" or "socket") or builtin = "<name>"',
                '[run]\ncommand = ["python3", "main.py"]',
            )
        )
    return findings


def split_tool_text(doc: Document, value: Any) -> tuple[Any, list[Finding]]:
    """S1: connector.toml never carries tool text. A `tools` table is N003 and is set aside, so the
    rest of the manifest still loads (rather than an unknown-key finding that drops the connector)."""
    if not isinstance(value, dict) or "tools" not in value:
        return value, []
    tools = value["tools"]
    names = [str(n) for n in tools] if isinstance(tools, dict) and tools else [""]
    findings = [
        Finding(
            "N003",
            doc.path,
            doc.line_of("tools", n) if n else doc.line_of("tools"),
            f"the connector supplies tool text{f' for {n!r}' if n else ''} (S1)",
            "no tools in connector.toml: agents read names, descriptions and schemas from the interface's tools.json",
            "remove the [tools] table; to change what agents read, propose a new interface version",
        )
        for n in names
    ]
    return {k: v for k, v in value.items() if k != "tools"}, findings


def _check_egress(doc: Document, at: tuple[str | int, ...], entry: str) -> list[Finding]:
    port = entry.rpartition(":")[2]
    if EGRESS.match(entry) and (port == "*" or 0 < int(port) < 65536):
        return []
    return [
        Finding(
            "N002",
            doc.path,
            doc.line_of(*at),
            f"egress entry '{entry}' is not host:port",
            "host:port, e.g. api.mistral.ai:443; '*' may stand for the host or the port",
            f'"{entry.split(":", maxsplit=1)[0] or "api.example.com"}:443"',
        )
    ]


def check_binding_file(doc: Document, spec: BindingFile, name: str) -> list[Finding]:
    findings = check_named(doc, spec, name)
    if (spec.connector is None) == (spec.addon is None):
        what = "both connector and addon" if spec.connector else "neither connector nor addon"
        findings.append(
            Finding(
                "B010",
                doc.path,
                doc.line_of("connector"),
                f"the binding names {what}",
                'exactly one of connector = "..." or addon = "..."',
                'connector = "<a folder of catalog/connectors>"',
            )
        )
    for slot, ref in spec.secrets.items():
        if not isinstance(ref, SecretRef):
            findings.append(
                Finding(
                    "B003",
                    doc.path,
                    doc.line_of("secrets", slot),
                    f"secret slot '{slot}' holds a literal value",
                    REFERENCE_FORMS,
                    secret_example(slot, "env"),
                )
            )
    for i, entry in enumerate(spec.egress or []):
        findings.extend(_check_egress(doc, ("egress", i), entry))
    return findings


# A profile is served on `$HANDLER_RUN_DIR/profiles/<name>.sock`, and a unix socket's path holds 107 bytes: a name
# past this leaves under 32 of them for the run folder, which every host chooses for itself.
_SOCKET_NAME_CHARS = 60


def check_profile_file(doc: Document, spec: ProfileFile, name: str) -> list[Finding]:
    findings = check_named(doc, spec, name)
    size = len(name.encode())
    if _SOCKET_NAME_CHARS < size <= MAX_NAME_CHARS:  # past the most, F007 (or F004) says so already
        findings.append(Finding(
            "P014", doc.path, doc.line_of("name") if spec.name else 1,
            f"the profile's name is {size} bytes long: its socket, $HANDLER_RUN_DIR/profiles/{name[:20]}….sock, "
            f"leaves {run_dir_room(name)} bytes of the {MAX_SOCKET_PATH} a unix socket's path holds for the run "
            "folder",
            f"a name of at most {_SOCKET_NAME_CHARS} characters, which leaves {run_dir_room('x' * _SOCKET_NAME_CHARS)} "
            "(the defaults, $XDG_RUNTIME_DIR/handler or /tmp/handler-$UID, take about 20)",
            "a shorter name (and file name)"))
    for i, entry in enumerate(spec.runner.egress if spec.runner is not None else []):
        findings.extend(_check_egress(doc, ("runner", "egress", i), entry))
    scope = PurePosixPath(spec.scope)
    if not spec.scope or ".." in scope.parts or "\\" in spec.scope:
        findings.append(
            Finding(
                "P013",
                doc.path,
                doc.line_of("scope"),
                f"scope '{spec.scope}' leaves the config root" if spec.scope else "scope is empty",
                "a folder path without '..', relative to the config root or absolute",
                f'scope = "work/{name}"',
            )
        )
    elif _WHOLE_SCOPE.match(posixpath.normpath(spec.scope)):
        whole = "the whole file system" if not spec.scope.strip("/") else "a whole home folder"
        findings.append(
            Finding(
                "P015",
                doc.path,
                doc.line_of("scope"),
                f"scope '{spec.scope}' opens {whole} to the agent's calls: a file argument may read or write what "
                "the service can there (its state and run folders, secrets files, keys)",
                "the agent's own work folder, holding only what its calls should reach",
                f'scope = "work/{name}"',
            )
        )
    return findings
