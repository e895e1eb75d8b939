"""`handler connector check CONNECTOR --binding B`: run the conformance plugin under pytest and say the verdict.

The command resolves the connector and binding first (a misspelt name gets "did you mean"), then
runs pytest (in a fresh interpreter, so nothing this process imported or set leaks into the check)
on the `interface.toml` of every interface version the connector implements, with the plugin's
options, an empty pytest configuration of its own (the tree's pytest settings, if any, are not the
check's) and no cache written into the tree. Pytest prints
its progress line, the failures with their minimal examples and the conformance summary; this
command adds the verdict, and records a complete run in `catalog/results/<connector>.json`, with its
evidence (`evidence_of`: what the connector ran against), from which `handler catalog build` lists it.

Exit codes: 0 every item passed, 1 a failure, 2 the check could not run as asked.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from conformance.defaults import DEFAULT_EXAMPLES
from conformance.errors import CheckError
from conformance.listing import EVIDENCE, record_run, tier_of_run
from conformance.workspace import Subject, load_subject

__all__ = ["add_connector_command", "check_connector", "check_env", "evidence_of"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_connector_command(sub: Any) -> None:
    """Register `handler connector check` (called by the CLI through the `handler.commands` entry points), beside
    the CLI's own `handler connector install` when the CLI made the `connector` command first."""
    check = _connector_actions(sub).add_parser(
        "check", help="run the interfaces' cases and schema fuzzing through a real router",
        description="For every interface version the connector implements: run each case of its "
                    "conformance/cases.toml, valid inputs generated from each tool's inputSchema and invalid "
                    "ones derived from it, through a real router and a real connector process. Exit 0 only "
                    "when all pass.")
    check.add_argument("connector", help="the connector's name (catalog/connectors/<name>)")
    check.add_argument("--binding", required=True, help="the binding that configures it (config/bindings/<name>)")
    check.add_argument("-n", dest="workers", metavar="N|auto", help="run the items in N processes (pytest-xdist), "
                       "each with its own router and connector; default: one process")
    check.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, metavar="K",
                       help=f"valid inputs generated per tool (default: {DEFAULT_EXAMPLES})")
    check.add_argument("--seed", type=int, metavar="S", help="the fuzzing seed, to replay a run (default: random)")
    check.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    check.add_argument("--json", metavar="FILE", help="write the JSON result (per item: outcome, duration, the "
                       "minimal failing input)")
    check.add_argument("--root", default=os.environ.get("HANDLER_ROOT") or ".", metavar="DIR",
                       help="the config root (default: $HANDLER_ROOT, else the current folder)")
    check.add_argument("-k", dest="select", metavar="EXPR", help="only the items matching EXPR (as pytest -k); a "
                       "partial run is not recorded")
    check.add_argument("--evidence", choices=EVIDENCE, help="what the connector runs against, recorded with the "
                       "result: local (an engine on this machine; the default for a connector without egress), "
                       "stand-in (a loopback stand-in of the vendor; the default otherwise) or vendor (the real "
                       "service, with real credentials; refused for a binding whose egress is loopback only)")
    check.add_argument("--results", metavar="DIR", help="record the run in DIR/<connector>.json (default: the "
                       "tree's catalog/results)")
    check.add_argument("--no-record", action="store_true", help="do not add the run to catalog/results/")
    check.add_argument("--connector-log", metavar="FILE", help="append what the connector writes to its stderr "
                       "(secrets masked) to FILE: why a connector fails, in its own words")
    check.set_defaults(run=_run)


def _connector_actions(sub: Any) -> Any:
    parser = sub.choices.get("connector")
    if parser is None:
        parser = sub.add_parser("connector", help="check a connector against the interfaces it implements")
        return parser.add_subparsers(title="connector commands", metavar="ACTION", required=True)
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _run(args: argparse.Namespace) -> int:
    return check_connector(args.connector, args.binding, root=Path(args.root), workers=args.workers,
                           examples=args.examples, seed=args.seed, junit=args.junit, json_path=args.json,
                           select=args.select, record=not args.no_record, connector_log=args.connector_log,
                           evidence=args.evidence, results=args.results)


def check_connector(connector: str, binding: str, *, root: Path = Path(), workers: str | None = None,
                    examples: int = DEFAULT_EXAMPLES, seed: int | None = None, junit: str | None = None,
                    json_path: str | None = None, select: str | None = None, record: bool = True,
                    extra: tuple[str, ...] = (), connector_log: str | None = None,
                    evidence: str | None = None, results: str | None = None) -> int:
    """Run the check and print its verdict; the exit code (0 pass, 1 fail, 2 could not run)."""
    missing = [name for name in ("pytest", "xdist", "hypothesis", "hypothesis_jsonschema") if find_spec(name) is None]
    if missing:
        print(f"handler connector check: {', '.join(missing)} not installed; the check needs the conformance extra:\n"
              "  fix: pip install 'handler-services[conformance]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        subject = load_subject(root, connector, binding)
        evidence = evidence_of(subject, evidence)
    except CheckError as exc:
        print(f"handler connector check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if examples < 1:
        print("handler connector check: --examples must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    with tempfile.TemporaryDirectory(prefix="handler-check-") as tmp:
        ini = Path(tmp, "pytest.ini")
        ini.write_text("[pytest]\n")
        result = Path(json_path) if json_path else Path(tmp, "result.json")
        result.unlink(missing_ok=True)
        manifests = [str(root / iface.folder / "interface.toml") for iface in subject.interfaces]
        argv = [sys.executable, "-m", "pytest", *manifests]
        # --assert=plain: the items judge with their own checks, and rewriting hypothesis at each start costs ~2 s.
        argv += ["-c", str(ini), "--rootdir", str(root), "--noconftest", "-p", "no:cacheprovider", "--assert=plain",
                 "--handler-connector", connector, "--handler-binding", binding, "--handler-root", str(root),
                 "--handler-seed", str(seed), "--handler-examples", str(examples), "--handler-json", str(result)]
        if workers:
            argv += ["-n", workers]
        if connector_log:
            argv += ["--handler-connector-log", str(Path(connector_log).absolute())]
        if junit:
            argv += ["--junit-xml", junit, "-o", "junit_family=xunit1"]  # xunit1 keeps each item's properties
        if select:
            argv += ["-k", select]
        code = subprocess.run([*argv, *extra], check=False, env={**os.environ, **check_env()}).returncode
        document = json.loads(result.read_text()) if result.exists() else None
    if document is None:
        print(f"handler connector check: pytest ended with code {code} before any result", file=sys.stderr)
        return EXIT_USAGE
    document["evidence"] = evidence
    if json_path:
        Path(json_path).write_text(json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return _verdict(root, document, code, Path(results) if results else None if record else False)


_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def evidence_of(subject: Subject, asked: str | None) -> str:
    """The evidence a run of `subject` is recorded with (docs/conformance.md, "Evidence").

    A connector without egress can only be `local`. Otherwise the default is `stand-in`, the least a run
    can claim; `vendor` is refused when the binding's egress is loopback only (it cannot reach the vendor),
    and `local` is allowed only then (an engine on this machine, such as Ollama). Raises `CheckError`.
    """
    name, binding = subject.connector.name, subject.binding
    if not subject.connector.spec.egress:
        if asked not in (None, "local"):
            raise CheckError(f"connector '{name}' reaches no network (egress = []): its evidence is local, not "
                             f"{asked}; drop --evidence")
        return "local"
    egress = binding.spec.egress if binding.spec.egress is not None else subject.connector.spec.egress
    loopback = bool(egress) and all(e.startswith(_LOOPBACK) for e in egress)
    if asked == "vendor" and loopback:
        raise CheckError(f"binding '{binding.name}' reaches only loopback ({', '.join(egress)}): a stand-in or a "
                         "local server, not the vendor; use --evidence stand-in (or local for a real engine here)")
    if asked == "local" and not loopback:
        raise CheckError(f"binding '{binding.name}' reaches beyond this machine ({', '.join(egress)}): its "
                         "evidence is stand-in or vendor, not local")
    return asked or "stand-in"


def check_env() -> dict[str, str]:
    """What a check's pytest gets in its environment besides ours: hypothesis keeps its files (its
    Unicode tables, seconds to rebuild in every new folder) in a user cache, not in the config tree."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return {}
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return {"HYPOTHESIS_STORAGE_DIRECTORY": str(cache / "handler" / "hypothesis")}


def _verdict(root: Path, document: dict[str, Any], code: int, record: Path | bool | None) -> int:
    """Print the verdict; record a complete run unless `record` is False (a Path: the results folder)."""
    name = document["connector"]
    for key, summary in sorted(document["interfaces"].items()):
        if document["complete"]:
            tier = tier_of_run(summary)
            passes = "passes" if summary["cases_pass"] and summary["fuzzing_pass"] else "fails"
            print(f"{name} on {key}: {passes}" + (f" (this run supports the tier '{tier}')" if tier
                                                  else " (this run supports no listing)"))
        else:
            ran = [i for i in document["items"] if i["interface"] == key]
            failed = sum(1 for i in ran if i["outcome"] != "passed")
            print(f"{name} on {key}: {len(ran) - failed} of {len(ran)} items run passed (a partial run)")
    if not document["items"]:
        print("handler connector check: no item ran", file=sys.stderr)
        return EXIT_FAILED
    print(f"evidence: {document['evidence']}")
    if record is not False and document["complete"]:
        path = record_run(root, document, record if isinstance(record, Path) else None)
        print(f"recorded in {path}; `handler catalog build` updates the listing")
    elif record is not False:
        print("not recorded: a partial run (-k, or items that did not run) is no evidence for the catalog")
    if code == 0 and document["passed"]:
        return EXIT_OK
    return EXIT_FAILED if code in (0, 1) else EXIT_USAGE
