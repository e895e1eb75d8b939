"""`handler validate`, `handler plan` and `handler mcp-config`: commands that read a config tree and print.

`mcp-config` prints the local bridges' entries, or, with `--url`, the entries of the profile's MCP endpoint over
HTTP for each host family, the bearer token read from an environment variable, never written into them.

Registered on the parser by `reconciler.cli`.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from reconciler.cli.common import EXIT_FINDINGS, EXIT_OK, add_root_options, folder_path, load_tree, print_findings
from reconciler.config import (
    CODES,
    GitSource,
    HandlerError,
    Loader,
    Snapshot,
    SourceError,
    check_frozen,
    plan_changes,
)
from reconciler.config.findings import sort_findings
from reconciler.config.skills import SKILL_FILE, host_skill_name, renamed_skill
from reconciler.places import default_run_dir
from reconciler.router.builtins import BUILTIN_INTERFACE

__all__ = ["add_tree_commands"]

HOSTS = ("claude-desktop", "cursor", "vscode", "claude-code")
REMOTE_HOSTS = ("claude-code", "vscode", "cursor", "generic")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def add_tree_commands(sub: Any) -> None:
    validate = sub.add_parser("validate", help="run the save-time checks on a config tree")
    add_root_options(validate)
    validate.add_argument("--base", metavar="REF", type=_ref,
                          help="freeze the interface versions that exist at this git ref")
    validate.add_argument("--format", choices=["text", "json", "github"], default="text",
                          help="text for people, json for tools, github for annotations on a pull request")
    validate.add_argument("--codes", action="store_true", help="list every finding code and exit")
    validate.set_defaults(run=_validate)

    plan = sub.add_parser("plan", help="what changes for each profile between a git ref and the tree")
    add_root_options(plan)
    plan.add_argument("--base", metavar="REF", type=_ref, help="compare with this git ref (default: HEAD of the "
                      "repository holding the tree; an empty tree when it has no commit or is not in git)")
    plan.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    plan.set_defaults(run=_plan)

    mcp = sub.add_parser("mcp-config", help="the mcpServers entries an MCP client needs to give an agent its profile")
    mcp.add_argument("profile", help="the profile the agent runs as (config/profiles/PROFILE.toml)")
    add_root_options(mcp)
    mcp.add_argument("--run-dir", type=folder_path, default=None, help="the router's run folder (default: "
                     "$HANDLER_RUN_DIR, else $XDG_RUNTIME_DIR/handler, else /tmp/handler-$UID)")
    mcp.add_argument("--host", choices=sorted({*HOSTS, *REMOTE_HOSTS}), default=None,
                     help="the MCP host's format: claude-desktop and cursor read {\"mcpServers\": ...}, vscode reads "
                          "{\"servers\": ...} with type stdio, claude-code gets `claude mcp add` commands "
                          "(default: claude-desktop; docs/hosts.md says where each file lives). With --url: "
                          "claude-code, vscode, cursor or generic, else each of them in turn")
    mcp.add_argument("--url", default=None, help="the service's address as the agent's machine reaches it (e.g. "
                     "https://mcp.example.org): print the entries of the profile's MCP endpoint over HTTP, "
                     "URL/mcp/PROFILE, instead of the local bridges")
    mcp.add_argument("--token-env", default="HANDLER_TOKEN", metavar="NAME", help="with --url: the environment "
                     "variable the host reads the profile's bearer token from (default: HANDLER_TOKEN); the token "
                     "itself is never written into the entries")
    mcp.add_argument("--skills", metavar="DIR", type=Path, default=None,
                     help="also write each interface's skill folder (DIR/<interface>-v<N>/SKILL.md) where the host "
                          "loads skills, e.g. .claude/skills for claude-code (docs/hosts.md)")
    mcp.set_defaults(run=_mcp_config)


def _mcp_config(args: argparse.Namespace) -> int:
    """One stdio server per interface of the profile, each the bridge `handler-service <interface> --no-builtins`,
    and one, `handler`, for the built-in tools: no tool name is in two entries (docs/hosts.md)."""
    snapshot = load_tree(args.root)
    profile = snapshot.profiles.get(args.profile)
    if profile is None:
        known = ", ".join(sorted(snapshot.profiles))
        raise HandlerError(f"no profile '{args.profile}' in {args.root} (profiles: {known})")
    if BUILTIN_INTERFACE in profile.selections:
        raise HandlerError(f"profile '{profile.name}' uses an interface named '{BUILTIN_INTERFACE}', the name of the "
                           "entry of the built-in tools; rename that interface")
    if args.skills is not None:
        for line in write_skills(snapshot, profile.name, Path(args.root), args.skills):
            print(line, file=sys.stderr)  # stdout stays the configuration, ready to paste
    if args.url is not None:
        return _remote_config(profile.name, args.url, args.token_env, args.host)
    if args.host not in (None, *HOSTS):
        raise HandlerError(f"--host {args.host} is for an endpoint over HTTP: give --url too")
    host = args.host or "claude-desktop"
    bridge = Path(sys.executable).parent / "handler-service"
    run_dir = (args.run_dir or default_run_dir()).resolve()
    command = str(bridge) if bridge.exists() else "handler-service"
    env = {"HANDLER_RUN_DIR": str(run_dir)}
    servers = {BUILTIN_INTERFACE: {"command": command, "args": [BUILTIN_INTERFACE, "--profile", profile.name],
                                   "env": env}}
    servers.update({name: {"command": command, "args": [name, "--profile", profile.name, "--no-builtins"],
                           "env": env} for name in sorted(profile.selections)})
    if host == "claude-code":
        for name, server in servers.items():
            print(shlex.join(["claude", "mcp", "add", name, "-e", f"HANDLER_RUN_DIR={run_dir}", "--", command,
                              *server["args"]]))
    elif host == "vscode":
        print(json.dumps({"servers": {name: {"type": "stdio", **s} for name, s in servers.items()}}, indent=2))
    else:
        print(json.dumps({"mcpServers": servers}, indent=2))
    return EXIT_OK


# Where each host keeps its entries, and how it reads a variable of its environment inside one.
_REMOTE_FILES = {"claude-code": (".mcp.json (Claude Code expands ${VAR} from its environment)", "${%s}"),
                 "vscode": (".vscode/mcp.json (VS Code expands ${env:VAR})", "${env:%s}"),
                 "cursor": ("~/.cursor/mcp.json or .cursor/mcp.json (Cursor expands ${env:VAR})", "${env:%s}"),
                 "generic": ("the generic form, for any host that takes a URL and headers", "${%s}")}


def _remote_config(profile: str, url: str, token_env: str, host: str | None) -> int:
    """The entries of `profile`'s MCP endpoint over HTTP for `host` (None: every family, each under its heading);
    the bearer token is a reference to `token_env`, which the host reads from its environment."""
    if host is not None and host not in REMOTE_HOSTS:
        raise HandlerError(f"--host {host} takes no remote entry in its file (Claude Desktop adds remote servers "
                           f"in its Connectors settings): use one of {', '.join(REMOTE_HOSTS)}")
    if _ENV_NAME.fullmatch(token_env) is None:
        raise HandlerError(f"--token-env {token_env!r} is not the name of an environment variable")
    base = url.rstrip("/")
    if not base.startswith(("https://", "http://")):
        raise HandlerError(f"--url {url!r} is not an http(s) address: give the service's address, e.g. "
                           "https://mcp.example.org")
    endpoint = base if base.endswith(f"/mcp/{profile}") else f"{base}/mcp/{profile}"
    for index, family in enumerate(REMOTE_HOSTS if host is None else (host,)):
        where, reference = _REMOTE_FILES[family]
        entry = _remote_entry(family, endpoint, "Bearer " + reference % token_env)
        if host is None:
            print(("\n" if index else "") + f"# {family}: {where}")
        print(json.dumps(entry if family == "generic" else
                         {"servers" if family == "vscode" else "mcpServers": {f"handler-{profile}": entry}}, indent=2))
    return EXIT_OK


def _remote_entry(family: str, endpoint: str, authorization: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "http", "url": endpoint, "headers": {"Authorization": authorization}}
    if family == "cursor":  # Cursor tells a remote server by its url alone
        del entry["type"]
    return entry


def write_skills(snapshot: Snapshot, profile: str, root: Path, into: Path) -> list[str]:
    """Write the skill folder of each interface `profile` uses under `into`, as `<interface>-v<N>` with its front
    matter's name set to match (the Agent Skills convention), so two versions never share one; what was written."""
    written = []
    for selection in sorted(snapshot.profiles[profile].selections.values(), key=lambda s: s.key):
        iface = snapshot.interfaces.get(selection.key)
        if iface is None or iface.skill is None:
            continue
        name = host_skill_name(iface.name, iface.version)
        folder = into / name
        source = root / iface.folder / "skills" / iface.skill.folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # What the skill's folder holds beside SKILL.md (references, scripts) goes with it.
            for extra in sorted(source.rglob("*")) if source.is_dir() else ():
                if extra.is_file() and not extra.is_symlink() and extra.name != SKILL_FILE:
                    (folder / extra.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                    (folder / extra.relative_to(source)).write_bytes(extra.read_bytes())
            (folder / SKILL_FILE).write_text(renamed_skill(iface.skill.text, name))
        except OSError as exc:
            raise HandlerError(f"cannot write the skill of {iface.key} in {folder}: {exc.strerror or exc}; name a "
                               "folder you can write with --skills") from None
        written.append(f"wrote the skill of {iface.key} to {folder / SKILL_FILE}")
    return written


def _load_base(root: str, ref: str) -> Snapshot:
    return Loader().load(GitSource.for_folder(root, ref))


def _load_head(root: str) -> Snapshot | None:
    """The tree at HEAD of the repository holding `root`: what `plan` compares with by default. None (an empty
    tree) when `root` is not in a git repository or it has no commit yet."""
    try:
        source = GitSource.for_folder(root, "HEAD")
        return Loader().load(source)
    except SourceError:
        return None


def _validate(args: argparse.Namespace) -> int:
    if args.codes:
        for code in CODES.values():
            print(f"{code.id}  {code.severity.value:7}  {code.title}")
        return EXIT_OK
    head = load_tree(args.root)
    findings = list(head.findings)
    if args.base:
        findings = sort_findings([*findings, *check_frozen(_load_base(args.root, args.base), head)])
    print_findings(findings, args.format, head)
    return EXIT_FINDINGS if any(f.is_error for f in findings) else EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    head = load_tree(args.root)
    if head.errors:
        print_findings(list(head.errors), "text", head)
        return EXIT_FINDINGS
    base = _load_base(args.root, args.base) if args.base else _load_head(args.root)
    plan = plan_changes(base, head)
    if args.format == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.render_text())
    return EXIT_OK


def _ref(text: str) -> str:
    """A git ref as given; an empty one is refused: in CI, `--base "$BASE_REF"` with the variable unset would
    otherwise turn the frozen-version check off without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the ref is empty: name a branch, a tag or a commit (in CI, is the variable "
                                         "set?)")
    return text
