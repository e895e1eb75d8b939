"""The catalog listing: which connectors are listed under each interface version, from result files only.

`handler connector check` records each complete run in `catalog/results/<connector>.json` (the
hashes it ran on and, per interface version, how its cases, fuzzing and refusals fared).
`handler catalog build` derives `catalog/listing.json` from those files and the current tree,
never from anything typed by hand. A result counts only at the current revision: the connector's
folder and the interface version's folder (its cases included) must hash as they did when it ran.

Tiers, from the newest runs at the current revision:
- `cases`: the interface's cases pass;
- `fuzzed`: the cases pass and so does fuzzing (generated valid inputs, refused invalid ones);
- `repeated`: both pass in the last three runs, each with its own seed.

Beside the tier, each entry says its evidence, recorded by the check with each run: `local` (an engine
on this machine), `stand-in` (a loopback stand-in of the vendor) or `vendor` (the real service, with
real credentials). An entry's tier and evidence come from the runs of the newest run's evidence only,
so a stand-in run never lifts an entry to `vendor`, nor a vendor run's tier to a stand-in's. A run
recorded without evidence counts for nothing. The listing's `connectors` table holds every
connector's last check (passed or failed, current or stale), for the dashboard.

`handler catalog build --check` (CI) fails when the listing names a connector, or a tier, that the
results do not support at the current revision, when a result file is not in the form the runner
writes, and (with `--base REF`) when a run added since REF is not reproduced by the workflow's own
re-runs (`rechecks`). `handler catalog changed --base REF` names the connectors to check again, and
`handler catalog list` prints each interface with its connectors, their tiers and evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance.errors import ListingError
from conformance.rechecks import changed_connectors, verify_reruns
from conformance.results import EVIDENCE, RESULTS_FOLDER, parse_results, read_results, results_text
from reconciler.config import FolderSource, Loader, Snapshot, SourceError

__all__ = [
    "EVIDENCE",
    "LISTING_FILE",
    "RESULTS_FOLDER",
    "TIERS",
    "add_catalog_command",
    "build_listing",
    "check_listing",
    "check_result_files",
    "parse_results",
    "read_results",
    "record_run",
    "render_listing",
    "results_text",
    "tier_of_run",
]

LISTING_FILE = "catalog/listing.json"
LISTING_FORMAT = "handler.catalog-listing/v1"
TIERS = ("cases", "fuzzed", "repeated")
REPEATS = 3  # runs in a row, each with its own seed, for `repeated`
KEEP_RUNS = 10  # runs kept per connector file, newest last
_KEEP = ("started", "binding", "binding_hash", "connector_hash", "commit", "seed", "examples", "workers", "passed",
         "evidence")
_RUN_KEYS = frozenset({*_KEEP, "interfaces"})
_RERUN = "restore the file from git, check the connector again (`handler connector check`), commit what it wrote"


def tier_of_run(summary: Mapping[str, Any]) -> str | None:
    """The tier one run's summary of an interface version supports on its own (`repeated` needs several)."""
    if not summary.get("cases_pass"):
        return None
    return "fuzzed" if summary.get("fuzzing_pass") else "cases"


def record_run(root: Path, document: Mapping[str, Any], folder: Path | None = None) -> Path:
    """Add a check's run (its JSON result, without the per-item detail) to the connector's result file, in
    `folder` (default: the tree's catalog/results)."""
    path = (folder if folder is not None else root / RESULTS_FOLDER) / f"{document['connector']}.json"
    runs = read_results(path) if path.exists() else []
    run = {k: document.get(k) for k in _KEEP}
    run["interfaces"] = {
        key: {k: v for k, v in summary.items() if k != "items"} for key, summary in document["interfaces"].items()
    }
    runs = [*runs, run][-KEEP_RUNS:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(results_text(document["connector"], runs))
    return path


def check_result_files(root: Path) -> list[str]:
    """An error for each result file that is not in the form the runner writes (its name, format, keys, order and
    layout): a hand edit that does not take care to look like the runner's is refused without a re-run."""
    folder = root / RESULTS_FOLDER
    errors: list[str] = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        rel = f"{RESULTS_FOLDER}/{path.name}"
        try:
            body = json.loads(path.read_bytes())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            errors.append(f"{rel}: not a result file the runner wrote ({exc})\n  fix: {_RERUN}")
            continue
        runs = body.get("runs") if isinstance(body, dict) else None
        ok = (path.suffix == ".json" and isinstance(runs, list) and body.get("connector") == path.stem
              and set(body) == {"format", "connector", "runs"}
              and all(isinstance(r, dict) and set(r) == _RUN_KEYS for r in runs)
              and path.read_text() == results_text(path.stem, runs))
        if not ok:
            errors.append(f"{rel}: not in the form `handler connector check` writes it (its keys, order or layout "
                          f"differ), so it was edited by hand\n  fix: {_RERUN}")
    return errors


def build_listing(root: Path, snapshot: Snapshot | None = None) -> dict[str, Any]:
    """The listing the result files support at the tree's current revision."""
    snapshot = snapshot or Loader().load(FolderSource(root))
    results = _all_results(root)
    interfaces: dict[str, list[dict[str, Any]]] = {key: [] for key in sorted(snapshot.interfaces)}
    for name, connector in sorted(snapshot.connectors.items()):
        for key in connector.spec.implements:
            iface = snapshot.interfaces.get(key)
            if iface is None:
                continue
            current = [r for r in results.get(name, []) if r.get("connector_hash") == connector.content_hash
                       and (r.get("interfaces") or {}).get(key, {}).get("interface_hash") == iface.content_hash]
            if not current:
                continue
            evidence = current[-1]["evidence"]
            current = [r for r in current if r["evidence"] == evidence]
            tier = _tier(current, key)
            if tier is None:
                continue
            latest = current[-1]
            interfaces[key].append({"connector": name, "tier": tier, "evidence": evidence,
                                    "binding": latest.get("binding"), "checked": latest.get("started"),
                                    "seed": latest.get("seed"), "commit": latest.get("commit"),
                                    "measured": _measured(latest, key)})
    return {
        "format": LISTING_FORMAT,
        "note": "built by `handler catalog build` from catalog/results/ at the current revision; never edit by hand",
        "tiers": {"cases": "the interface's cases pass", "fuzzed": "cases and schema fuzzing pass",
                  "repeated": f"cases and fuzzing pass in the last {REPEATS} runs, each with its own seed"},
        "evidence": {"local": "checked against an engine on this machine",
                     "stand-in": "checked against a loopback stand-in of the vendor: the wire, not the vendor",
                     "vendor": "checked against the real service, with real credentials"},
        "interfaces": interfaces,
        "connectors": _last_checks(snapshot, results),
    }


def _last_checks(snapshot: Snapshot, results: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each connector's last recorded check: passed or failed, its evidence, and whether it is of the current
    revision (its folder and its interfaces' folders hash as they did when it ran)."""
    out: dict[str, Any] = {}
    for name, connector in sorted(snapshot.connectors.items()):
        runs = results.get(name, [])
        if not runs:
            out[name] = {"checked": None}
            continue
        last = runs[-1]
        current = last.get("connector_hash") == connector.content_hash and all(
            (last.get("interfaces") or {}).get(key, {}).get("interface_hash") == iface.content_hash
            for key in connector.spec.implements if (iface := snapshot.interfaces.get(key)) is not None)
        out[name] = {"checked": last.get("started"), "passed": bool(last.get("passed")),
                     "evidence": last["evidence"], "binding": last.get("binding"), "commit": last.get("commit"),
                     "current": current,
                     "measured": {key: m for key in connector.spec.implements if (m := _measured(last, key))}}
    return out


def _measured(run: Mapping[str, Any], key: str) -> dict[str, Any]:
    """What the run measured on interface version `key` (case → word error rates by place): the listing's evidence
    of how well, beside the tier's of whether."""
    found = ((run.get("interfaces") or {}).get(key) or {}).get("measured")
    return dict(found) if isinstance(found, dict) else {}


def check_listing(root: Path, listing: Mapping[str, Any], snapshot: Snapshot | None = None) -> tuple[
        list[str], list[str]]:
    """(errors, notes): errors for entries the results do not support now; notes for a listing behind them."""
    whole = build_listing(root, snapshot)
    built = whole["interfaces"]
    errors: list[str] = []
    notes: list[str] = []
    given = listing.get("interfaces")
    if not isinstance(given, dict):
        return [f"{LISTING_FILE} has no 'interfaces' table; rebuild it with `handler catalog build`"], []
    found = listing.get("connectors")
    claimed: Mapping[str, Any] = found if isinstance(found, dict) else {}
    for name, last in sorted(claimed.items()):
        have = whole["connectors"].get(name) or {}
        if isinstance(last, dict) and last.get("passed") and not have.get("passed"):
            errors.append(f"{LISTING_FILE}: says connector '{name}' passed its last check, but its last recorded "
                          "check did not\n  fix: handler catalog build")
    for key, entries in sorted(given.items()):
        supported = {e["connector"]: e["tier"] for e in built.get(key, [])}
        shown = {e["connector"]: e["evidence"] for e in built.get(key, [])}
        measured = {e["connector"]: e["measured"] for e in built.get(key, [])}
        for entry in entries if isinstance(entries, list) else []:
            name, tier = entry.get("connector"), entry.get("tier")
            have = supported.get(name)
            if have is not None and entry.get("measured", {}) != measured[name]:
                errors.append(f"{LISTING_FILE}: {key} shows for '{name}' measures its results do not hold "
                              f"({entry.get('measured')} against {measured[name]})\n  fix: handler catalog build")
            if have is not None and entry.get("evidence") != shown[name]:
                errors.append(f"{LISTING_FILE}: {key} lists '{name}' with the evidence '{entry.get('evidence')}', but "
                              f"its results are '{shown[name]}'\n  fix: handler catalog build")
            if have is None:
                errors.append(f"{LISTING_FILE}: {key} lists '{name}' without a passing result at the current revision"
                              f" (its files or {key}'s changed since, or it was never checked)\n"
                              f"  fix: handler connector check {name} --binding <binding>, then handler catalog build")
            elif tier not in TIERS or TIERS.index(have) < TIERS.index(tier):
                errors.append(f"{LISTING_FILE}: {key} lists '{name}' as '{tier}', but its results support "
                              f"'{have}'\n  fix: handler catalog build")
    for key, entries in sorted(built.items()):
        listed = {e.get("connector"): e.get("tier") for e in given.get(key, []) if isinstance(e, dict)}
        for entry in entries:
            now = listed.get(entry["connector"])
            if now is None or (now in TIERS and TIERS.index(now) < TIERS.index(entry["tier"])):
                notes.append(f"{key}: '{entry['connector']}' qualifies as '{entry['tier']}' but the listing says "
                             f"{now or 'nothing'}; `handler catalog build` updates it")
    return errors, notes


def add_catalog_command(sub: Any) -> None:
    """Register `handler catalog build`, `changed` and `list` (through the `handler.commands` entry points)."""
    catalog = sub.add_parser("catalog", help="the catalog listing, built from conformance results")
    actions = catalog.add_subparsers(title="catalog commands (default: list)", metavar="ACTION")
    root_help = "the config root (default: $HANDLER_ROOT, else the current folder)"
    default_root = os.environ.get("HANDLER_ROOT") or "."
    build = actions.add_parser("build", help=f"write {LISTING_FILE} from {RESULTS_FOLDER}/ (--check: verify it)")
    build.add_argument("--root", default=default_root, metavar="DIR", help=root_help)
    build.add_argument("--check", action="store_true", help="write nothing; exit 1 if the listing names a connector "
                       "or tier without a passing result at the current revision, or a result file is not the "
                       "runner's")
    build.add_argument("--base", metavar="REF", help="with --check: every run a result file gained since the git ref "
                       "REF must be reproduced by a re-run in --reruns (the workflow's own)")
    build.add_argument("--reruns", metavar="DIR", help="with --check: the result files the re-runs recorded (without "
                       "--base, every run at the current revision must be reproduced there)")
    build.set_defaults(run=_build)
    changed = actions.add_parser("changed", help="connectors to check again since a git ref: connector, binding "
                                 "(:stand-in: its stand-in check), seeds to replay (-: a fresh one)")
    changed.add_argument("--base", metavar="REF", help="the git ref to compare with (default: none, every connector)")
    changed.add_argument("--root", default=default_root, metavar="DIR", help=root_help)
    changed.set_defaults(run=_changed)
    shown = actions.add_parser("list", help="each interface with its connectors, tier and evidence")
    shown.add_argument("--root", default=default_root, metavar="DIR", help=root_help)
    shown.set_defaults(run=_list)
    # `handler catalog` alone lists, as `handler catalog list` does with its own defaults.
    catalog.set_defaults(run=lambda args: _list(shown.parse_args([])))


def _build(args: argparse.Namespace) -> int:
    root = Path(args.root)
    try:
        snapshot = Loader().load(FolderSource(root))
        listing = build_listing(root, snapshot)
    except (ListingError, SourceError) as exc:
        print(f"handler catalog build: {exc}", file=sys.stderr)
        return 2
    path = root / LISTING_FILE
    if args.check:
        return _check(root, path, snapshot, args.base, Path(args.reruns) if args.reruns else None)
    path.write_text(json.dumps(listing, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    for key, entries in listing["interfaces"].items():
        shown = ", ".join(f"{e['connector']} ({e['tier']})" for e in entries) or "-"
        print(f"{key:16} {shown}")
    print(f"wrote {path}")
    return 0


def _check(root: Path, path: Path, snapshot: Snapshot, base: str | None, reruns: Path | None) -> int:
    """`catalog build --check`: the listing against the results, the results against the runner's form and (with
    a base) against the workflow's re-runs."""
    if not path.exists():
        print(f"handler catalog build --check: {path} is missing; run `handler catalog build`", file=sys.stderr)
        return 1
    try:
        given = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        print(f"{path}:{exc.lineno}: not JSON ({exc.msg}); rebuild it with `handler catalog build`", file=sys.stderr)
        return 1
    errors, notes = check_listing(root, given, snapshot)
    errors += check_result_files(root)
    if base is not None or reruns is not None:  # re-runs and no base: every run at this revision is compared
        try:
            errors += verify_reruns(root, base, reruns)
        except SourceError as exc:
            print(f"handler catalog build --check: {exc}", file=sys.stderr)
            return 2
    for line in [*errors, *notes]:
        print(line)
    print(f"handler catalog build --check: {len(errors)} error(s), {len(notes)} note(s)")
    return 1 if errors else 0


def _changed(args: argparse.Namespace) -> int:
    try:
        found = changed_connectors(Path(args.root), args.base)
    except (SourceError, ListingError) as exc:
        print(f"handler catalog changed: {exc}", file=sys.stderr)
        return 2
    for recheck in found:
        if recheck.binding is None:
            print(f"handler catalog changed: connector '{recheck.connector}' changed but no binding configures it; "
                  "it cannot be checked", file=sys.stderr)
        else:
            print(recheck.line())
    return 0


def _list(args: argparse.Namespace) -> int:
    root = Path(args.root)
    try:
        listing = build_listing(root)
    except (ListingError, SourceError) as exc:
        print(f"handler catalog list: {exc}", file=sys.stderr)
        return 2
    for line in render_listing(listing, Loader().load(FolderSource(root))):
        print(line)
    return 0


def render_listing(listing: Mapping[str, Any], snapshot: Snapshot) -> list[str]:
    """`handler catalog list`'s lines: per interface version, its listed connectors best tier first, then those
    it does not list (never checked, failed, or changed since), each with its evidence and what it measured."""
    lines: list[str] = []
    rank = {tier: i for i, tier in enumerate(TIERS)}
    for key, entries in sorted(listing["interfaces"].items()):
        lines.append(key)
        listed = sorted(entries, key=lambda e: (-rank.get(e["tier"], -1), e["connector"]))
        for entry in listed:
            lines.append(f"  {entry['connector']:26} {entry['tier']:9} {entry['evidence']:9}"
                         f"{_show_measured(entry.get('measured') or {})}".rstrip())
        names = {e["connector"] for e in entries}
        for name, connector in sorted(snapshot.connectors.items()):
            if key not in connector.spec.implements or name in names:
                continue
            last = listing["connectors"].get(name) or {}
            if last.get("checked") is None:
                status = "never checked"
            elif not last.get("current"):
                status = "changed since its last check"
            else:
                status = "failed its last check" if not last.get("passed") else "no passing cases"
            evidence = str(last.get("evidence") or "-")
            lines.append(f"  {name:26} {'-':9} {evidence:9}{_show_measured((last.get('measured') or {}).get(key, {}))}"
                         f"  ({status})")
    return lines


def _show_measured(measured: Mapping[str, Any]) -> str:
    shown = []
    for case, rates in sorted(measured.items()):
        for where, rate in sorted(rates.items()):
            label = "round-trip word error" if where.endswith("spokenWordErrorRate") else "word error"
            shown.append(f"{label} {float(rate):.1%} ({case})")
    return f" {'; '.join(shown)}" if shown else ""


def _tier(runs: Sequence[Mapping[str, Any]], key: str) -> str | None:
    if not runs:
        return None
    tier = tier_of_run(runs[-1]["interfaces"][key])
    if tier != "fuzzed":
        return tier
    seeds: set[Any] = set()
    for run in reversed(runs):
        if tier_of_run(run["interfaces"][key]) != "fuzzed":
            break
        seeds.add(run.get("seed"))
    return "repeated" if len(seeds) >= REPEATS else "fuzzed"


def _all_results(root: Path) -> dict[str, list[dict[str, Any]]]:
    folder = root / RESULTS_FOLDER
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        runs = read_results(path)
        out[path.stem] = sorted(runs, key=lambda r: str(r.get("started") or ""))
    return out
