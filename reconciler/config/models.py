"""The data model of the config tree: one pydantic model per file kind (docs/architecture.md §4).

Models are frozen and refuse unknown keys, so a typo is a finding rather than a silently ignored
value. They describe the shape of one file; whether the files agree with each other is the job of
`checks`. Field names follow the files (camelCase where the files use it).
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from reconciler.wire.meta import MOST_USD

__all__ = [
    "ENV_NAME",
    "REFERENCE_FORMS",
    "ActionClass",
    "Annotations",
    "BindingFile",
    "Caps",
    "ConnectorFile",
    "Defaults",
    "Group",
    "HttpAuth",
    "HttpSpec",
    "InterfaceFile",
    "Limits",
    "Member",
    "Needs",
    "OrgCaps",
    "OrgFile",
    "Outcome",
    "Policy",
    "PolicyScope",
    "PolicyWhen",
    "ProfileFile",
    "Routing",
    "Rule",
    "RunSpec",
    "Runner",
    "SandboxSpec",
    "SecretRef",
    "SecretSlot",
    "SettingSpec",
    "SlackSpec",
    "TemplateFile",
    "Tool",
    "WrapError",
    "WrapSpec",
    "WrapTool",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


# An amount of money in the tree: a number from 0 to `MOST_USD` (`wire.meta`). Not infinite, not NaN (TOML writes
# both), not negative: a negative price would credit the caps it is charged to.
Usd = Annotated[float, Field(ge=0, le=MOST_USD, allow_inf_nan=False)]

# The name of something in the tree: the store keeps names in columns of 200 characters, and with a prefix
# ("instance <id>", "profile:<name>"), so a name is at most 100. A tool's name is at most 128, as MCP advises.
MAX_NAME_CHARS = 100
MAX_TOOL_NAME_CHARS = 128
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
ToolName = Annotated[str, Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)]
AbsolutePath = Annotated[str, Field(pattern=r"^/", description="an absolute path of the host")]


class ActionClass(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    DESTRUCTIVE = "destructive"


class Outcome(enum.StrEnum):
    """What governance does with a call: the decision words of the design."""

    AUTO = "auto"
    APPROVE = "approve"
    BLOCK = "block"


# --- interfaces ---------------------------------------------------------------------------------


class Limits(_Model):
    maxFileBytes: int | None = Field(default=None, gt=0)
    timeoutSeconds: float | None = Field(default=None, gt=0)
    maxConcurrent: int | None = Field(default=None, gt=0)
    maxCallsPerRun: int | None = Field(default=None, gt=0)


class InterfaceFile(_Model):
    apiVersion: Literal["handler.interface/v1"]
    name: Name
    version: int = Field(ge=1)
    description: str
    limits: Limits = Limits()
    errors: dict[str, str] = {}


class Annotations(_Model):
    model_config = ConfigDict(frozen=True, extra="allow")
    title: str | None = None
    readOnlyHint: bool | None = None
    destructiveHint: bool | None = None
    idempotentHint: bool | None = None
    openWorldHint: bool | None = None


class Tool(_Model):
    """One MCP tool exactly as agents see it."""

    name: ToolName
    title: str | None = None
    description: str
    inputSchema: dict[str, Any]
    outputSchema: dict[str, Any] | None = None
    annotations: Annotations = Annotations()

    @property
    def action_class(self) -> ActionClass:
        """read / write / destructive from the standard MCP hints; unstated counts as destructive."""
        if self.annotations.readOnlyHint:
            return ActionClass.READ
        if self.annotations.destructiveHint is False:
            return ActionClass.WRITE
        return ActionClass.DESTRUCTIVE


# --- connectors ---------------------------------------------------------------------------------


class SecretSlot(_Model):
    env: str
    required: bool = False
    description: str = ""


class SettingSpec(_Model):
    env: str
    required: bool = False
    description: str = ""
    default: str | None = None


class RunSpec(_Model):
    command: list[str] | None = None
    transport: Literal["stdio", "socket"] = "stdio"
    builtin: str | None = None
    # How long the process may take to answer `initialize` (or to listen, for "socket"): a connector that loads
    # a model before it serves says so here, so its start is never charged to a call's time limit.
    startSeconds: float = Field(default=20.0, gt=0, le=600)


class WrapError(_Model):
    """A server's tool error that means an interface error: `match`, a regular expression, is
    searched in the error's text; the first entry that matches names the interface's `error`."""

    match: str = Field(min_length=1)
    error: str


class WrapTool(_Model):
    """How one interface tool reaches the wrapped server (docs/config.md, "[wrap]")."""

    tool: str  # the server's tool
    arguments: dict[str, str] = {}  # interface argument → the server's argument
    fixed: dict[str, Any] = {}  # server argument → the value always sent
    reshape: str | None = None  # one of snapshot.RESHAPERS; default: [wrap] reshape
    errors: list[WrapError] = []  # tried in order, before [wrap] error
    # Regular expressions cut out of the server's text before it is reshaped: the server's own advice
    # that names arguments the interface does not have (S1: the interface owns what the model reads).
    drop: list[str] = []


class WrapSpec(_Model):
    """Run an existing MCP server under the interface's names.

    `tools` maps each interface tool to the server's: a name (the short form, using the renames,
    reshaper and error of `[wrap]` itself) or a table of its own (`WrapTool`). A server's JSON-RPC
    error is always `unavailable`; a tool error becomes a domain error only where a pattern (or
    `error`, for every tool) maps it.
    """

    tools: dict[str, str | WrapTool]
    arguments: dict[str, str] = {}  # renames for every tool; a tool's own win
    reshape: str | None = None  # one of snapshot.RESHAPERS; None = the server's structuredContent
    error: str | None = None  # the interface error every unmatched tool error becomes (default unavailable)

    def tool(self, name: str) -> WrapTool:
        """What interface tool `name` calls, with `[wrap]`'s own renames and reshaper filled in."""
        given = self.tools.get(name, name)
        own = WrapTool(tool=given) if isinstance(given, str) else given
        return own.model_copy(update={"arguments": {**self.arguments, **own.arguments},
                                      "reshape": own.reshape or self.reshape})


class SandboxSpec(_Model):
    memoryMb: int | None = Field(default=None, gt=0)
    cpuSeconds: int | None = Field(default=None, gt=0)
    fileBytes: int | None = Field(default=None, gt=0)
    processes: int | None = Field(default=None, gt=0, le=65536)  # processes and threads at once
    tmpMb: int | None = Field(default=None, gt=0)  # its private /tmp (also its HOME)
    diskMb: int | None = Field(default=None, gt=0)  # what it may keep in its call and socket folders


# A PEP 508 requirement by name, with extras, version specifiers and a marker; never a pip option
# (`--index-url ...`) nor a direct URL (`name @ https://...`): what a connector installs comes from the registry.
_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\s*\[[A-Za-z0-9._,\s-]*\])?"
    r"\s*(?:(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*(?:,\s*(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*)*)?"
    r"(?:;[^@]*)?$"
)
_DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_PROGRAM = re.compile(r"^[A-Za-z0-9_+.-]+$")


class Needs(_Model):
    """What a connector needs beyond the service (docs/config.md): Python packages, installed into an
    environment of its own by `handler connector install`; Debian packages and programs, checked at its start."""

    python: list[str] = []  # requirement strings, e.g. "pocketsphinx>=5.1.1,<6"
    debian: list[str] = []  # Debian package names, e.g. "festival"
    programs: list[str] = []  # executables that must be on PATH, e.g. "text2wave"
    # Commands run once in the built environment, after its packages (e.g. fetching a package's own data);
    # `python`/`python3` first is the environment's Python. Needs `python`.
    setup: list[list[str]] = []

    @model_validator(mode="after")
    def _well_formed(self) -> Needs:
        if self.setup and not self.python:
            raise ValueError("setup: runs in the connector's own Python environment; declare its packages in "
                             "python = [...] too")
        for command in self.setup:
            if not command or not all(word.strip() for word in command):
                raise ValueError(f"setup: {command!r} is not a command such as [\"python3\", \"-m\", \"pkg.setup\"] "
                                 "(a list of non-empty words)")
        for requirement in self.python:
            if not _REQUIREMENT.match(requirement.strip()):
                raise ValueError(f"python: {requirement!r} is not a requirement such as \"pocketsphinx>=5.1,<6\" "
                                 "(a package name with optional extras, versions and marker; no pip options, no URLs)")
        for package in self.debian:
            if not _DEBIAN_PACKAGE.match(package):
                raise ValueError(f"debian: {package!r} is not a Debian package name such as \"festival\"")
        for program in self.programs:
            if not _PROGRAM.match(program):
                raise ValueError(f"programs: {program!r} is not a program name such as \"text2wave\" (no path)")
        return self


class ConnectorFile(_Model):
    apiVersion: Literal["handler.connector/v1"]
    name: Name
    description: str = ""
    implements: list[str]
    egress: list[str] = []
    secretSlots: dict[str, SecretSlot] = {}
    settings: dict[str, SettingSpec] = {}
    run: RunSpec = RunSpec()
    wrap: WrapSpec | None = None
    sandbox: SandboxSpec = SandboxSpec()
    needs: Needs = Needs()


# --- bindings -----------------------------------------------------------------------------------


# An environment variable's name, as a shell writes one: what an `env` secret reference names.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# How a secret reference is written, for the findings that say what a slot should hold.
REFERENCE_FORMS = 'a reference — { command = [...] }, { env = "NAME" } or { file = "path" }'


def _secret_error(form: str, message: str) -> PydanticCustomError:
    """A secret reference's own error: `checks.syntax` words it for the slot, with an example of `form`, and never
    shows what was written (it may be the secret itself)."""
    return PydanticCustomError("secret_reference", message, {"form": form})


class SecretRef(_Model):
    """Where a secret comes from: exactly one of a command (its program first), an environment variable's name
    or a file's path. A literal value is never accepted, nor a reference that could never name a secret."""

    command: list[str] | None = None
    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _names_a_secret(self) -> SecretRef:
        given = [k for k in ("command", "env", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            named = " and ".join(given) if given else "none of command, env and file"
            raise _secret_error(given[0] if given else "env",
                                f"the reference names {named}; it names exactly one of command, env or file")
        if self.command is not None and not (self.command and self.command[0].strip()):
            raise _secret_error("command", "the command names no program (its first word is missing or empty)")
        if self.env is not None and not ENV_NAME.fullmatch(self.env):
            raise _secret_error("env", "what env names is not an environment variable's name (letters, digits "
                                       "and '_', not starting with a digit); a secret is given by reference, never "
                                       "by value")
        if self.file is not None and (not self.file.strip() or any(c in self.file for c in "\0\n\r")):
            raise _secret_error("file", "what file names is not a path (it is empty, or holds a line break or a NUL)")
        named_by: tuple[tuple[str, str | None], ...] = (("env", self.env), ("file", self.file),
                                                         ("command", (self.command or [""])[0]))
        for form, target in named_by:
            if target and looks_like_a_key(target):
                shape = {"env": "a variable's name", "file": "a path", "command": "a program"}[form]
                raise _secret_error(form, f"what {form} names has the shape of a key or token, not of {shape}; a "
                                          "secret is given by reference, never by value: put it in the service's "
                                          "environment or a file readable by the service alone, and name that")
        return self


# The prefixes vendors give their keys and tokens, and PEM's armour: a reference naming one is a value pasted in.
_KEY_PREFIXES = ("sk-", "sk_live_", "sk_test_", "rk_live_", "pk_live_", "ghp_", "gho_", "ghs_", "github_pat_",
                 "glpat-", "xoxb-", "xoxp-", "xapp-", "AKIA", "ASIA", "AIza", "hf_")


def looks_like_a_key(text: str) -> bool:
    """Whether `text`, given where a reference names a variable, a path or a program, has the shape of a secret: a
    vendor's key prefix, or a long unbroken run of mixed letters and digits no name or path is made of."""
    if text.startswith("-----BEGIN"):
        return True
    if any(c in text for c in "/. "):
        return False
    prefix = next((p for p in _KEY_PREFIXES if text.startswith(p)), None)
    if prefix is not None and len(text) - len(prefix) >= 16:
        return True
    if len(text) < 24:
        return False
    kinds = sum((any(c.islower() for c in text), any(c.isupper() for c in text), any(c.isdigit() for c in text)))
    return kinds == 3 and sum(c.isdigit() for c in text) >= 4


def _secret_form(value: Any) -> str | None:
    return "literal" if isinstance(value, str) else "reference" if isinstance(value, dict | SecretRef) else None


# A string is a literal secret, kept in the model so the check can point at it (B003); a table is read as a
# reference alone, so its errors are a reference's; anything else is neither.
Secret = Annotated[
    Annotated[SecretRef, Tag("reference")] | Annotated[str, Tag("literal")],
    Discriminator(_secret_form, custom_error_type="secret_reference", custom_error_context={"form": "env"},
                  custom_error_message="not a reference: a secret is named by where it is, never written as a "
                                       "value"),
]


class BindingFile(_Model):
    apiVersion: Literal["handler.binding/v1"]
    name: Name | None = None
    connector: str | None = None
    addon: str | None = None
    description: str = ""
    secrets: dict[str, Secret] = {}
    settings: dict[str, str | int | float | bool] = {}
    egress: list[str] | None = None
    pricing: dict[str, Usd] = {}
    limits: Limits | None = None


# --- profiles -----------------------------------------------------------------------------------


class Routing(_Model):
    to: Literal["member", "slack", "caller", "none"]
    member: str | None = None
    channel: str | None = None

    @model_validator(mode="after")
    def _target(self) -> Routing:
        if self.to == "member" and not self.member:
            raise ValueError('routing to = "member" needs member = "<member id>"')
        if self.to == "slack" and not self.channel:
            raise ValueError('routing to = "slack" needs channel = "#channel"')
        return self


class Rule(_Model):
    service: str | None = None
    action: str | None = None
    outcome: Literal["allow", "approve", "block"]

    @model_validator(mode="after")
    def _one_target(self) -> Rule:
        if (self.service is None) == (self.action is None):
            raise ValueError("a rule names exactly one of service or action")
        return self

    @property
    def decision(self) -> Outcome:
        return Outcome.AUTO if self.outcome == "allow" else Outcome(self.outcome)


class Caps(_Model):
    monthly_usd: Usd | None = None
    instance_usd: Usd | None = None


class Runner(_Model):
    """How a profile's agent runs when another agent or a member starts it (docs/agents.md).

    `command` is given the run's input as its last argument, the profile's MCP configuration and its
    instance through the environment; its last line of output is the run's result.
    """

    command: list[str] = Field(min_length=1)
    timeoutSeconds: float = Field(default=600, gt=0, le=86400)
    maxConcurrent: int = Field(default=2, gt=0, le=64)  # runs of this profile at once
    maxPerParent: int = Field(default=8, gt=0, le=1000)  # runs one parent run may start of this profile
    # Its sandbox (docs/agents.md): host folders it may read (an agent host's installation), hosts it may reach.
    readable: list[AbsolutePath] = []
    egress: list[str] = []


class ProfileFile(_Model):
    apiVersion: Literal["handler.profile/v1"]
    name: Name | None = None
    description: str = ""
    group: str | None = None
    scope: str
    template: str | None = None
    services: dict[str, str] = {}
    pins: list[str] = []
    routing: Routing | None = None
    rules: list[Rule] = []
    caps: Caps = Caps()
    agents: list[str] = []  # the profiles this one may run with agent/v1's agent_run
    runner: Runner | None = None


# --- org and templates --------------------------------------------------------------------------


class Member(_Model):
    email: str | None = None
    slack: str | None = None
    owner: bool = False


class Group(_Model):
    members: list[str] = []
    description: str = ""


class Defaults(_Model):
    template: str | None = None
    services: dict[str, str] = {}


class SlackSpec(_Model):
    channels: list[str] = []


class PolicyScope(_Model):
    action: str | None = None
    service: str | None = None
    profile: str | None = None
    group: str | None = None
    org: bool | None = None

    @model_validator(mode="after")
    def _one(self) -> PolicyScope:
        given = [k for k in ("action", "service", "profile", "group", "org") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a policy scope names exactly one of action, service, profile, group or org")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("action", "service", "profile", "group", "org") if getattr(self, k) is not None)


class PolicyWhen(_Model):
    cost_above: float | None = None
    cost_below: float | None = None


class Policy(_Model):
    name: Name
    scope: PolicyScope
    when: PolicyWhen | None = None
    approver: Routing | None = None
    priority: int = 0


class OrgCaps(_Model):
    monthly_usd: Usd | None = None


# A claim's name in a JWT: a key of its payload (`handler_profile`, `groups`, `https://example.org/profile`).
ClaimName = Annotated[str, Field(min_length=1, max_length=200)]


class HttpAuth(_Model):
    """`[http.auth]`: an OpenID Connect issuer whose JWTs are credentials of the MCP endpoints beside the service's
    own tokens (`governance/credentials.py`, docs/hosts.md). Its URLs are checked by O008."""

    issuer: str = Field(min_length=1, max_length=2000)
    audience: str = Field(min_length=1, max_length=2000)
    profileClaim: ClaimName = "handler_profile"  # a string naming the profile, or a list of strings holding it
    instanceClaim: ClaimName | None = None  # the agent run its calls are logged and capped under, when the IdP says
    jwksUri: str | None = Field(default=None, min_length=1, max_length=2000)  # else the issuer's discovery document


class HttpSpec(_Model):
    auth: HttpAuth | None = None


class OrgFile(_Model):
    apiVersion: Literal["handler.org/v1"]
    name: Name
    description: str = ""
    requires: list[str] = []
    defaults: Defaults = Defaults()
    members: dict[Name, Member] = {}
    groups: dict[str, Group] = {}
    slack: SlackSpec = SlackSpec()
    policies: list[Policy] = []
    caps: OrgCaps = OrgCaps()
    http: HttpSpec = HttpSpec()
    suspended: bool = False
    prepaid: bool = False
    allowEmpty: bool = False


class TemplateFile(_Model):
    apiVersion: Literal["handler.template/v1"]
    name: Name
    description: str = ""
    read: Outcome
    write: Outcome
    destructive: Outcome

    def outcome_for(self, action_class: ActionClass) -> Outcome:
        return {ActionClass.READ: self.read, ActionClass.WRITE: self.write}.get(action_class, self.destructive)
