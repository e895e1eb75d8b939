"""Generate large, valid config trees for the benchmarks (and the reconciler's reload figures)."""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["generate_tree"]

_TEMPLATES = ("permissive", "balanced", "restrictive")


def _tool(iface: str, verb: str, read: bool) -> dict[str, object]:
    prefix = iface.replace("-", "_")
    return {
        "name": f"{prefix}_{verb}",
        "description": f"{verb} with {iface}",
        "inputSchema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["text"],
            "properties": {"text": {"type": "string", "maxLength": 1000},
                           "count": {"type": "integer", "minimum": 1, "maximum": 10}},
        },
        "outputSchema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["items"],
            "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
            "$defs": {"item": {"type": "object", "additionalProperties": False, "required": ["text"],
                               "properties": {"text": {"type": "string"}, "score": {"type": "number"}}}},
        },
        "annotations": {"readOnlyHint": read, **({} if read else {"destructiveHint": verb == "delete"})},
    }


def generate_tree(root: Path, interfaces: int = 200, connectors: int = 1000, profiles: int = 5000,
                  seed: int = 7) -> Path:
    """Write a tree of `interfaces` interfaces (3 tools each), `connectors` connectors with one binding
    each, and `profiles` profiles selecting 3 services each, with rules and pins; it validates clean."""
    rng = random.Random(seed)
    names = [f"cap{i:03d}" for i in range(interfaces)]
    for name in names:
        folder = root / "catalog/interfaces" / name / "v1"
        folder.mkdir(parents=True)
        (folder / "interface.toml").write_text(
            f'apiVersion = "handler.interface/v1"\nname = "{name}"\nversion = 1\ndescription = "{name}"\n\n'
            "[limits]\ntimeoutSeconds = 30\nmaxConcurrent = 4\n\n[errors]\n"
            'unavailable = "down"\nlimit = "rate limited"\n')
        tools = [_tool(name, "read", True), _tool(name, "write", False), _tool(name, "delete", False)]
        (folder / "tools.json").write_text(json.dumps(tools, indent=2))
        (folder / "skills" / name).mkdir(parents=True)
        (folder / "skills" / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {name}\n---\n")
    by_iface: dict[str, list[str]] = {n: [] for n in names}
    for i in range(connectors):
        iface = names[i % interfaces]
        conn = f"conn{i:04d}"
        folder = root / "catalog/connectors" / conn
        folder.mkdir(parents=True)
        (folder / "connector.toml").write_text(
            f'apiVersion = "handler.connector/v1"\nname = "{conn}"\nimplements = ["{iface}/v1"]\n'
            f'egress = ["api{i}.example.com:443"]\n\n[secretSlots.api_key]\nenv = "API_KEY"\nrequired = true\n\n'
            '[settings.model]\nenv = "MODEL"\n\n[run]\ncommand = ["python3", "main.py"]\n')
        # What [run] names must be there (N007: a manifest without code is a stub); the benchmarks never run it.
        (folder / "main.py").write_text(f'"""The {conn} connector of a generated tree."""\n')
        bindings = root / "config/bindings"
        bindings.mkdir(parents=True, exist_ok=True)
        (bindings / f"bind{i:04d}.toml").write_text(
            f'apiVersion = "handler.binding/v1"\nname = "bind{i:04d}"\nconnector = "{conn}"\n'
            f'description = "binding {i}"\nsecrets = {{ api_key = {{ env = "KEY_{i}" }} }}\n'
            f'settings = {{ model = "m{i}" }}\n\n[pricing]\n{iface}_write = 0.01\n')
        by_iface[iface].append(f"bind{i:04d}")
    org = root / "config/org.toml"
    org.write_text('apiVersion = "handler.org/v1"\nname = "bench"\n\n[members.alice]\nemail = "a@example.org"\n'
                   'owner = true\n\n[groups.all]\nmembers = ["alice"]\n\n[slack]\nchannels = ["#approvals"]\n')
    profiles_dir = root / "config/profiles"
    profiles_dir.mkdir(parents=True)
    for p in range(profiles):
        chosen = rng.sample(names, 3)
        services = ", ".join(f'{n} = "{rng.choice(by_iface[n])}"' for n in chosen)
        rules = f'\n[[rules]]\naction = "{chosen[0]}_write"\noutcome = "allow"\n' if p % 3 == 0 else ""
        (profiles_dir / f"agent{p:05d}.toml").write_text(
            f'apiVersion = "handler.profile/v1"\nname = "agent{p:05d}"\ngroup = "all"\nscope = "work/agent{p:05d}"\n'
            f'template = "{_TEMPLATES[p % 3]}"\nservices = {{ {services} }}\npins = ["{chosen[1]}"]\n'
            f'routing = {{ to = "slack", channel = "#approvals" }}\n{rules}\n[caps]\nmonthly_usd = 10.0\n')
    return root
