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
results do not support at the current revision. `handler catalog changed --base REF` names the
connectors whose files (or whose interfaces' files) changed since REF, with a binding to check them.
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
from reconciler.config import FolderSource, GitSource, Loader, Snapshot, SourceError

__all__ = [
    "EVIDENCE",
    "LISTING_FILE",
    "RESULTS_FOLDER",
    "TIERS",
    "add_catalog_command",
    "build_listing",
    "changed_connectors",
    "check_listing",
    "record_run",
    "tier_of_run",
]

RESULTS_FOLDER = "catalog/results"
LISTING_FILE = "catalog/listing.json"
RESULTS_FORMAT = "handler.conformance-results/v1"
LISTING_FORMAT = "handler.catalog-listing/v1"
TIERS = ("cases", "fuzzed", "repeated")
EVIDENCE = ("local", "stand-in", "vendor")
REPEATS = 3  # runs in a row, each with its own seed, for `repeated`
KEEP_RUNS = 10  # runs kept per connector file, newest last


def tier_of_run(summary: Mapping[str, Any]) -> str | None:
    """The tier one run's summary of an interface version supports on its own (`repeated` needs several)."""
    if not summary.get("cases_pass"):
        return None
    return "fuzzed" if summary.get("fuzzing_pass") else "cases"


def record_run(root: Path, document: Mapping[str, Any], folder: Path | None = None) -> Path:
    """Add a check's run (its JSON result, without the per-item detail) to the connector's result file, in
    `folder` (default: the tree's catalog/results)."""
    path = (folder if folder is not None else root / RESULTS_FOLDER) / f"{document['connector']}.json"
    runs = _read_results(path) if path.exists() else []
    keep = ("started", "binding", "binding_hash", "connector_hash", "commit", "seed", "examples", "workers", "passed",
            "evidence")
    run = {k: document.get(k) for k in keep}
    run["interfaces"] = {
        key: {k: v for k, v in summary.items() if k != "items"} for key, summary in document["interfaces"].items()
    }
    runs = [*runs, run][-KEEP_RUNS:]
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": RESULTS_FORMAT, "connector": document["connector"], "runs": runs}
    path.write_text(json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return path


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
                                    "seed": latest.get("seed"), "commit": latest.get("commit")})
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
                     "current": current}
    return out


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
        for entry in entries if isinstance(entries, list) else []:
            name, tier = entry.get("connector"), entry.get("tier")
            have = supported.get(name)
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


def changed_connectors(root: Path, base: str | None) -> list[tuple[str, str | None]]:
    """(connector, a binding of it or None) for each connector whose folder, interfaces, bindings or result file
    changed since the git ref `base` (with no base: every connector). A result file changed by hand (a pass
    written, not run) is checked again like code. Only connectors without egress are named: they run here,
    offline; one that reaches a network is checked against its stand-in by the test suite, or against the
    vendor with real credentials (`--evidence vendor`), never by this list."""
    head = Loader().load(FolderSource(root))
    source = GitSource.for_folder(root, base) if base else None
    before = Loader().load(source) if source is not None else Loader().load(_Empty())
    changed: list[tuple[str, str | None]] = []
    for name, connector in sorted(head.connectors.items()):
        if connector.spec.egress or connector.spec.run.builtin:
            continue
        bindings = sorted(b for b, spec in head.bindings.items() if spec.connector == name)
        moved = (_hash(before.connectors, name) != connector.content_hash
                 or any(_hash(before.interfaces, key) != _hash(head.interfaces, key)
                        for key in connector.spec.implements)
                 or any(_hash(before.bindings, b) != head.bindings[b].content_hash for b in bindings)
                 or (source is not None and _results_changed(root, source, name)))
        if moved:
            changed.append((name, bindings[0] if bindings else None))
    return changed


def add_catalog_command(sub: Any) -> None:
    """Register `handler catalog build` and `handler catalog changed` (through the `handler.commands` entry points)."""
    catalog = sub.add_parser("catalog", help="the catalog listing, built from conformance results")
    actions = catalog.add_subparsers(title="catalog commands", metavar="ACTION", required=True)
    build = actions.add_parser("build", help=f"write {LISTING_FILE} from {RESULTS_FOLDER}/ (--check: verify it)")
    build.add_argument("--root", default=os.environ.get("HANDLER_ROOT") or ".", metavar="DIR",
                       help="the config root (default: $HANDLER_ROOT, else the current folder)")
    build.add_argument("--check", action="store_true", help="write nothing; exit 1 if the listing names a connector "
                       "or tier without a passing result at the current revision")
    build.set_defaults(run=_build)
    changed = actions.add_parser("changed", help="connectors whose files changed since a git ref, with a binding")
    changed.add_argument("--base", metavar="REF", help="the git ref to compare with (default: none, every connector)")
    changed.add_argument("--root", default=os.environ.get("HANDLER_ROOT") or ".", metavar="DIR",
                         help="the config root (default: $HANDLER_ROOT, else the current folder)")
    changed.set_defaults(run=_changed)


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
        if not path.exists():
            print(f"handler catalog build --check: {path} is missing; run `handler catalog build`", file=sys.stderr)
            return 1
        try:
            given = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            print(f"{path}:{exc.lineno}: not JSON ({exc.msg}); rebuild it with `handler catalog build`",
                  file=sys.stderr)
            return 1
        errors, notes = check_listing(root, given, snapshot)
        for line in [*errors, *notes]:
            print(line)
        print(f"handler catalog build --check: {len(errors)} error(s), {len(notes)} note(s)")
        return 1 if errors else 0
    path.write_text(json.dumps(listing, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    for key, entries in listing["interfaces"].items():
        shown = ", ".join(f"{e['connector']} ({e['tier']})" for e in entries) or "-"
        print(f"{key:16} {shown}")
    print(f"wrote {path}")
    return 0


def _changed(args: argparse.Namespace) -> int:
    try:
        found = changed_connectors(Path(args.root), args.base)
    except SourceError as exc:
        print(f"handler catalog changed: {exc}", file=sys.stderr)
        return 2
    for name, binding in found:
        if binding is None:
            print(f"handler catalog changed: connector '{name}' changed but no binding configures it; it cannot be "
                  "checked", file=sys.stderr)
        else:
            print(f"{name} {binding}")
    return 0


def _results_changed(root: Path, source: GitSource, name: str) -> bool:
    """Whether `name`'s result file differs from the one at `source`'s commit."""
    rel = f"{RESULTS_FOLDER}/{name}.json"
    path = root / rel
    now = path.read_bytes() if path.is_file() else None
    try:
        blob = source.repo.commit(source.ref).tree / "/".join(filter(None, (source.subdir, rel)))
        then: bytes | None = blob.data_stream.read()
    except KeyError:  # not at the base
        then = None
    return now != then


class _Empty:
    """A tree with nothing in it: against it, everything changed."""

    def read(self) -> tuple[str, dict[str, Any]]:
        return "empty", {}


def _hash(objects: Mapping[str, Any], name: str) -> str | None:
    found = objects.get(name)
    return found.content_hash if found is not None else None


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
        runs = _read_results(path)
        out[path.stem] = sorted(runs, key=lambda r: str(r.get("started") or ""))
    return out


def _read_results(path: Path) -> list[dict[str, Any]]:
    try:
        body = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ListingError(f"{path}: not a readable result file ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != RESULTS_FORMAT or not isinstance(body.get("runs"), list):
        raise ListingError(f"{path}: not a result file (format {RESULTS_FORMAT} with a list of runs)")
    return [r for r in body["runs"] if isinstance(r, dict) and r.get("evidence") in EVIDENCE]
