"""The audit trail as `handler audit` reads it; its rows are written by the store (`store.audit.record`),
inside the transaction of the change each one describes."""

from __future__ import annotations

from reconciler.governance.store.audit import read_audit

__all__ = ["read_audit"]
