"""The preflight: what would keep the service from doing its job on this machine (docs/architecture.md §8).

`handler validate` judges the config tree as data, the same on any machine (it runs in pull
requests). The preflight judges this machine against it, as `handler doctor` prints it, `handler up`
says it at start and the dashboard shows it:

- the sandbox: can connectors start here at all (bubblewrap, libseccomp, user namespaces);
- the run folder and the state folder: each is a folder, or can be made (no file in its place);
- per binding a profile uses: every secret reference resolves now (an env variable set, a file
  readable, a command that answers), and its connector's program is on this machine;
- per binding of the tree, used or not (`binding_checks`): the same two, so a page offering a binding can say
  it cannot start before anyone picks it;
- per profile: its socket's path fits under the run folder (a unix socket's path holds 107 bytes); its
  scope folder exists; where it routes holds (Slack, a member), that channel is
  configured here (`HANDLER_SLACK_TOKEN`, `HANDLER_SMTP_URL`), else nobody is told of a hold and
  only the dashboard and `handler approvals` can decide it.

The service runs it at start, again on each revision it applies, and when `handler doctor` asks it: what it
finds is judged in the service's own environment and sandbox (`docs/troubleshooting.md`).

Each problem says what is wrong and how to fix it; `error`s stop calls from working, `warning`s
leave them working with less than the tree asks for.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from reconciler.config.snapshot import Profile, Snapshot
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.launching import resolve_command
from reconciler.connectors.sandbox import confined_env, sandbox_support
from reconciler.connectors.secrets import resolve_secret
from reconciler.places import SHORTER_SOCKET, default_run_dir, default_state_dir, not_a_folder, socket_too_long
from reconciler.web.mail import MailError, MailSettings
from reconciler.web.slack import SlackSettings

__all__ = ["Problem", "binding_checks", "preflight"]


@dataclass(frozen=True, slots=True)
class Problem:
    level: Literal["error", "warning"]
    subject: str  # "binding ocr-local", "profile researcher", "sandbox"
    message: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        return f"{self.level}: {self.subject}: {self.message}\n  fix: {self.fix}"


async def preflight(snapshot: Snapshot, root: Path, env: Mapping[str, str], *, sandbox: bool = True,
                    run_dir: Path | None = None, state_dir: Path | None = None) -> list[Problem]:
    """Every problem of this machine with `snapshot`, most basic first; `run_dir` is where the profiles' sockets go
    (default: `HANDLER_RUN_DIR`'s default), `state_dir` the service's state folder (default: `HANDLER_STATE_DIR`'s
    of `env`, else `.handler/` under `root`)."""
    run_dir = run_dir if run_dir is not None else default_run_dir()
    state_dir = state_dir if state_dir is not None else default_state_dir(root, env)
    problems: list[Problem] = []
    if sandbox:
        support = sandbox_support()
        if not support.ok:
            problems.append(Problem("error", "sandbox", "no connector can start: " + support.reason,
                                    "install what it names, or run the service with --no-sandbox"))
    for subject, folder, setting in (("run folder", run_dir, "HANDLER_RUN_DIR (or --run-dir)"),
                                     ("state folder", state_dir, "HANDLER_STATE_DIR (or --state-dir)")):
        if (problem := not_a_folder(folder)) is not None:
            problems.append(Problem("error", subject, f"{problem}: the service cannot start",
                                    f"point {setting} at a folder, or move what is there away"))
    used = sorted({s.binding for p in snapshot.profiles.values() for s in p.selections.values() if s.binding})
    for name in used:
        problems += await _binding_problems(snapshot, name, root)
    for profile in sorted(snapshot.profiles.values(), key=lambda p: p.name):
        problems += _profile_problems(snapshot, profile, root, env, run_dir)
    return problems


async def binding_checks(snapshot: Snapshot, root: Path) -> dict[str, list[Problem]]:
    """Per binding of the tree, what keeps its connector from starting on this machine now (an empty list: nothing)."""
    return {name: await _binding_problems(snapshot, name, root) for name in sorted(snapshot.bindings)}


async def _binding_problems(snapshot: Snapshot, name: str, root: Path) -> list[Problem]:
    binding = snapshot.bindings.get(name)
    if binding is None or binding.connector is None or binding.connector not in snapshot.connectors:
        return []
    connector = snapshot.connectors[binding.connector]
    subject = f"binding {name}"
    problems = []
    for slot, ref in binding.spec.secrets.items():
        try:
            await resolve_secret(slot, ref, root)
        except ConnectorStartError as exc:
            problems.append(Problem("error", subject, exc.message, _secret_fix(ref)))
    command = connector.spec.run.command
    if command:
        program = resolve_command(command, root / connector.folder)[0]
        path = confined_env({}, Path.home()).get("PATH")
        if shutil.which(program, path=path) is None:
            problems.append(Problem("error", subject, f"connector {connector.name} runs '{program}', which is not "
                                    "on this machine", f"install it (see {connector.folder}/PROVISIONING.md)"))
    return problems


def _secret_fix(ref: object) -> str:
    env = getattr(ref, "env", None)
    if env:
        return f"export {env}=... in the service's environment before it starts"
    if getattr(ref, "file", None):
        return "create that file, readable by the service"
    return "make the command print the secret and exit 0"


def _profile_problems(snapshot: Snapshot, profile: Profile, root: Path, env: Mapping[str, str],
                      run_dir: Path) -> list[Problem]:
    subject = f"profile {profile.name}"
    problems = []
    if (too_long := socket_too_long(run_dir, profile.name)) is not None:
        problems.append(Problem("error", subject, f"{too_long}: the router cannot serve it", SHORTER_SOCKET))
    scope = Path(profile.spec.scope)
    scope = scope if scope.is_absolute() else root / scope
    if not scope.is_dir():
        problems.append(Problem("error", subject, f"its scope {profile.spec.scope} does not exist: every call with a "
                                "file fails", f"mkdir -p {scope}"))
    routing = profile.spec.routing
    if routing is None:
        return problems
    if routing.to == "slack" and SlackSettings.from_env(env).token is None:
        problems.append(Problem("warning", subject, f"holds are routed to Slack {routing.channel}, but no Slack token "
                                "is set: nobody is told of a hold", "set HANDLER_SLACK_TOKEN (a bot token with "
                                "chat:write); until then owners decide on the dashboard or with `handler approvals`"))
    if routing.to == "member":
        problems += _member_problems(snapshot, subject, routing.member or "", env)
    return problems


def _member_problems(snapshot: Snapshot, subject: str, member: str, env: Mapping[str, str]) -> list[Problem]:
    known = snapshot.org.members.get(member) if snapshot.org is not None else None
    if known is None:
        return []  # the save-time checks name a member the org does not have
    try:
        mail = MailSettings.from_env(env)
    except MailError as exc:
        return [Problem("error", subject, str(exc), "fix HANDLER_SMTP_URL")]
    if known.email and mail is None and not (known.slack and SlackSettings.from_env(env).token):
        return [Problem("warning", subject, f"holds are routed to {member}, but no mail server is set: nobody is "
                        "told of a hold", "set HANDLER_SMTP_URL (and HANDLER_MAIL_FROM); until then owners decide on "
                        "the dashboard or with `handler approvals`")]
    return []
