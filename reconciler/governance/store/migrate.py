"""Applying the store's Alembic migrations on an open connection (called by `Store.migrate`).

The Alembic environment lives in `migrations/`; it takes the connection (already inside the
caller's locked transaction) from the config's attributes, so no alembic.ini is needed.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection

from reconciler.governance.errors import StoreError

__all__ = ["current_revision", "head_revision", "upgrade"]

_SCRIPTS = Path(__file__).resolve().parent / "migrations"


def _config(conn: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    if conn is not None:
        config.attributes["connection"] = conn
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:  # the package always ships its migrations; an empty folder is a broken install
        raise StoreError(f"no migrations in {_SCRIPTS}: the installation is incomplete")
    return head


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(conn: Connection) -> str:
    """Bring the schema on `conn` to the newest revision; returns it. A store that a newer version of the
    project migrated is left as it is: this version refuses it, saying so (docs/scaling.md)."""
    head = head_revision()
    current = current_revision(conn)
    if current != head:
        if current is not None and not _known(current):
            raise StoreError(
                f"the store's schema is at revision {current}, which this version does not know (its newest is "
                f"{head}): a newer version of handler has migrated it. Upgrade handler on this host to that "
                "version; routers of the newer version keep running on it meanwhile")
        try:
            command.upgrade(_config(conn), "head")
        except CommandError as exc:
            raise StoreError(f"cannot migrate the store: {exc}") from exc
    return head


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except CommandError:
        return False
