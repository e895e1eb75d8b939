"""`handler status` as an operator reads it: what the service applied, and pricing violations this month."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from reconciler.gitops.status import Applied, Attempt, Status, write_status
from reconciler.governance.store import open_store, store_url
from reconciler.governance.store.audit import record
from tests.fixtures.echo_tree import write_echo_tree

HANDLER = str(Path(sys.executable).with_name("handler"))


def _applied_tree(tmp_path: Path) -> Path:
    root = write_echo_tree(tmp_path / "tree")
    attempt = Attempt("abc123", "2026-12-01T00:00:00Z", 12.0, "applied", "start")
    write_status(root / ".handler/status.json",
                 Status(f"worktree {root}", Applied("abc123", 1, "2026-12-01T00:00:00Z"), attempt))
    return root


def _status(root: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HANDLER, "status", str(root), *more], capture_output=True, text=True,
                          timeout=60, check=False)


def test_status_counts_the_pricing_violations_of_this_month(tmp_path: Path) -> None:
    root = _applied_tree(tmp_path)
    quiet = _status(root)
    assert quiet.returncode == 0, quiet.stderr
    assert "pricing violations" not in quiet.stdout  # none yet: nothing to say
    store = open_store(store_url(root))
    try:
        for _ in range(2):
            with store.begin() as tx:
                record(tx, "pricing_violation", profile="tester", tool="echo_say",
                       detail={"binding": "echo-local", "reported": 1_000_000, "reserved": 10_000})
    finally:
        store.close()
    told = _status(root)
    assert "pricing violations this month: 2" in told.stdout, told.stdout
    assert json.loads(_status(root, "--format", "json").stdout)["pricingViolations"] == 2
