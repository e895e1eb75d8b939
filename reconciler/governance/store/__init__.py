"""The store: the only code that speaks SQL — holds, spend, notices and the audit trail, on SQLite or PostgreSQL.

By job: `engine` opens the store (`open_store`, `store_url`) and runs its transactions (`Store.begin`,
`Store.read`); `tables` is the schema, which `migrate` and `migrations/` (Alembic) apply; `holds`,
`spend`, `leases`, `notices` and `audit` hold the statements of each concern; `backlog` gathers writes no
decision waits for and commits them together (`committing`: from the event loop when it can);
`listening` hears other routers (PostgreSQL LISTEN/NOTIFY). Nothing outside this package imports
SQLAlchemy, Alembic or psycopg (an import-linter contract in pyproject.toml): the rest of governance
gets rows as dicts, hands the open `Transaction` on without looking into it, and sees database
failures as `StoreError`.
"""

from reconciler.governance.store.engine import Store, Transaction, now, open_store, store_exists, store_url

__all__ = ["Store", "Transaction", "now", "open_store", "store_exists", "store_url"]
