"""Result files: `catalog/results/<connector>.json`, the runs `handler connector check` recorded, read and written.

`listing` records runs into them and builds the listing from them; `rechecks` compares them with the
workflow's re-runs. The text is always `results_text`'s, so a file in another form was not written by
the runner (`listing.check_result_files`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance.errors import ListingError

__all__ = ["EVIDENCE", "RESULTS_FOLDER", "RESULTS_FORMAT", "parse_results", "read_results", "results_text"]

RESULTS_FOLDER = "catalog/results"
RESULTS_FORMAT = "handler.conformance-results/v1"
EVIDENCE = ("local", "stand-in", "vendor")


def results_text(connector: str, runs: Sequence[Mapping[str, Any]]) -> str:
    """A result file's text, exactly as the runner writes it."""
    body = {"format": RESULTS_FORMAT, "connector": connector, "runs": list(runs)}
    return json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def read_results(path: Path) -> list[dict[str, Any]]:
    """The runs of a result file that count (with an evidence); `ListingError` if it is not one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ListingError(f"{path}: not a readable result file ({exc.strerror})") from None
    return parse_results(data, str(path))


def parse_results(data: bytes, where: str) -> list[dict[str, Any]]:
    """The runs of a result file's bytes that count (with an evidence); `ListingError` naming `where` if not one."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ListingError(f"{where}: not a readable result file ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != RESULTS_FORMAT or not isinstance(body.get("runs"), list):
        raise ListingError(f"{where}: not a result file (format {RESULTS_FORMAT} with a list of runs)")
    return [r for r in body["runs"] if isinstance(r, dict) and r.get("evidence") in EVIDENCE]
