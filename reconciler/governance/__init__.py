"""Governance: the decision, holds, spend and the store (docs/architecture.md §7).

The modules, by job: `rulebook` compiles a snapshot into lookup tables; `decide` is the pure
decision with its trace; `explain` renders it (`handler explain`); `store` and `migrations/` hold the
schema (SQLite or PostgreSQL, Alembic); `holds`, `ledger`, `auditing` and `batching` write to it;
`governor` is the router's `Gate` (`gate`) over all of them; `listening` wakes routers on
PostgreSQL. Nothing is imported here, so that the router's import of `gate` stays light.
"""
