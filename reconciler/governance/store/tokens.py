"""The rows of the MCP endpoints' bearer tokens: add one, find one by its digest, list them, delete one.

`governance.credentials` makes and checks tokens and calls these; a token is stored by the SHA-256 of its text,
never the text. Adding and deleting write their audit row in the same transaction, so the trail says who made or
revoked which token, and when, exactly when the store holds it so.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from reconciler.governance.store.audit import record
from reconciler.governance.store.engine import Store, now
from reconciler.governance.store.tables import tokens

__all__ = ["delete_token", "fetch_token", "fetch_tokens", "insert_token"]


def insert_token(store: Store, values: dict[str, Any]) -> bool:
    """Store a token (name, digest, profile, instance, created_by, expires_at); False when the name is taken."""
    with store.begin() as tx:
        taken = tx.execute(sa.select(tokens.c.name).where(tokens.c.name == values["name"])).first()
        if taken is not None:
            return False
        tx.execute(sa.insert(tokens).values(created_at=now(), **values))
        record(tx, "token_created", profile=values["profile"], instance=values.get("instance"),
               actor=values["created_by"], detail={"name": values["name"], "expires_at": values.get("expires_at")})
    return True


def fetch_token(store: Store, digest: str) -> dict[str, Any] | None:
    """The token whose SHA-256 is `digest`, or None."""
    with store.read() as conn:
        row = conn.execute(sa.select(tokens).where(tokens.c.digest == digest)).first()
    return None if row is None else dict(row._mapping)


def fetch_tokens(store: Store) -> list[dict[str, Any]]:
    """Every token, by profile then name; their digests left out."""
    query = sa.select(*(c for c in tokens.c if c.name != "digest")).order_by(tokens.c.profile, tokens.c.name)
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def delete_token(store: Store, name: str, actor: str) -> dict[str, Any] | None:
    """Delete the token named `name`, returning its row (None: there is none)."""
    with store.begin() as tx:
        row = tx.execute(store.for_update(sa.select(tokens).where(tokens.c.name == name))).first()
        if row is None:
            return None
        tx.execute(sa.delete(tokens).where(tokens.c.name == name))
        found = dict(row._mapping)
        record(tx, "token_revoked", profile=found["profile"], instance=found["instance"], actor=actor,
               detail={"name": name})
    return found
