"""Governance: the decision, holds, spend and the store (docs/architecture.md §7).

The modules, by job: `rulebook` compiles a snapshot into lookup tables (`rulebook_cache` keeps the
latest few); `decide` is the pure decision with its trace; `explain` renders it (`handler
explain`); `holds`, `ledger` and `notices` are the life of a hold, of spend and of an approver's
notice; `leases` is a router's book of budget leases (slices of the caps it spends in memory) and
`leasekeeper` keeps it in line with the store; `store/` alone speaks SQL (the schema, its Alembic
migrations, the statements of each concern, SQLite or PostgreSQL). On the call path, `gate` is the
router's seam; `governed` is the real gate, made of `admissions` (admit, settle, the built-ins'
answers, with `lanes` and `recording`) and `holdrunner` (approved holds, each run once), which share
`workers` (store calls off the event loop). Nothing is imported here, so that the router's import of `gate` stays light.
"""
