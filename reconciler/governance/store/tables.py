"""The store's schema: SQLAlchemy Core tables, one for both backends.

Alembic's migrations (`migrations/`) create and change exactly these tables; a test compares them.
Only the store package reads them: the rest of governance gets rows as dicts.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["alerts", "audit", "balances", "holds", "leases", "metadata", "notices", "reservations", "spend",
           "tokens"]

metadata = sa.MetaData()

# A held call: what the approver sees, its decision and, once run, its result.
holds = sa.Table(
    "holds", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revision", sa.String(80), nullable=False),
    sa.Column("profile", sa.String(200), nullable=False),
    sa.Column("instance", sa.String(200), nullable=False),
    sa.Column("parent_instance", sa.String(200)),
    sa.Column("interface", sa.String(200), nullable=False),
    sa.Column("tool", sa.String(200), nullable=False),
    sa.Column("binding", sa.String(200), nullable=False),
    sa.Column("arguments", sa.JSON, nullable=False),
    sa.Column("cost", sa.BigInteger, nullable=False),  # the estimate, micro-USD
    sa.Column("approver", sa.JSON),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("trace", sa.JSON, nullable=False),
    # pending → approved → running → executed | failed; pending → rejected
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("decided_by", sa.String(200)),
    sa.Column("decided_at", sa.Float),
    sa.Column("decision_reason", sa.Text),  # why the approver rejected it, in their words (migration 0003)
    sa.Column("claimed_by", sa.String(80)),
    sa.Column("claimed_at", sa.Float),
    sa.Column("finished_at", sa.Float),
    sa.Column("result", sa.JSON),
    sa.Column("message", sa.Text, nullable=False, server_default=""),
    sa.Column("charged", sa.BigInteger),
    # Why an approved run failed, for the people deciding (the hold page, `approvals show`, the audit
    # trail): the router's cause and what the connector said, which the agent's `message` leaves out.
    sa.Column("cause", sa.Text),
)

# Every decision and every change of a hold or the balance, in order.
audit = sa.Table(
    "audit", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("event", sa.String(32), nullable=False),
    sa.Column("request_id", sa.String(40), index=True),
    sa.Column("profile", sa.String(200)),
    sa.Column("instance", sa.String(200)),
    sa.Column("tool", sa.String(200)),
    sa.Column("actor", sa.String(200)),
    sa.Column("status", sa.String(16)),
    sa.Column("detail", sa.JSON, nullable=False),
    # Only pricing violations and rows set aside are read by time (this month's): an index on every row's time
    # cost a quarter of each insert (migrations 0005, 0006).
    sa.Index("ix_audit_violations", "at", sqlite_where=sa.text("event = 'pricing_violation'"),
             postgresql_where=sa.text("event = 'pricing_violation'")),
    sa.Index("ix_audit_set_aside", "at", sqlite_where=sa.text("event = 'set_aside'"),
             postgresql_where=sa.text("event = 'set_aside'")),
)

# Spend per scope ("org:acme", "profile:assistant", "instance:assistant/abc") per calendar month (UTC).
spend = sa.Table(
    "spend", metadata,
    sa.Column("scope", sa.String(420), primary_key=True),
    sa.Column("month", sa.String(7), primary_key=True),
    sa.Column("micros", sa.BigInteger, nullable=False),
)

# The prepaid balance of an org, micro-USD.
balances = sa.Table(
    "balances", metadata,
    sa.Column("account", sa.String(200), primary_key=True),
    sa.Column("micros", sa.BigInteger, nullable=False),
)

# One reservation per admitted priced call, settled to the actual cost or released.
reservations = sa.Table(
    "reservations", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("request_id", sa.String(40)),
    sa.Column("month", sa.String(7), nullable=False),
    sa.Column("scopes", sa.JSON, nullable=False),
    sa.Column("account", sa.String(200)),  # the prepaid account charged, if any
    sa.Column("reserved", sa.BigInteger, nullable=False),
    sa.Column("charged", sa.BigInteger),
    sa.Column("state", sa.String(16), nullable=False),  # reserved | settled | released
)

# A router's slice of one cap's headroom (a spend row: scope and month) or of a prepaid balance (account),
# taken in one transaction and spent in memory (migration 0004). `granted` is counted in the spend row
# (or taken from the balance) while the lease is open; `issued` is the most the router's calls against
# it may have cost, written before the router admits past it, so that a lease its router never returns
# (a `kill -9`) gives back only `granted - issued` when it is reconciled.
leases = sa.Table(
    "leases", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("router", sa.String(80), nullable=False, index=True),
    sa.Column("scope", sa.String(420)),  # "org:acme", "profile:p", "instance:p/i"; NULL for a balance
    sa.Column("month", sa.String(7)),  # the spend row's month; NULL for a balance
    sa.Column("account", sa.String(200)),  # the prepaid account; NULL for a spend row
    sa.Column("granted", sa.BigInteger, nullable=False),
    sa.Column("issued", sa.BigInteger, nullable=False),
    sa.Column("charged", sa.BigInteger, nullable=False),  # what its settled calls cost, as last written
    sa.Column("taken_at", sa.Float, nullable=False),
    sa.Column("renewed_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),  # open | returned | reconciled
)

# The outbox of approver notifications: one row per hold and channel target, written with the hold
# in one transaction, so a hold is never stored without its notices; sent (and retried) by the
# notifier of `handler up`.
notices = sa.Table(
    "notices", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("hold_id", sa.String(40), nullable=False, index=True),
    sa.Column("channel", sa.String(16), nullable=False),  # email | slack
    sa.Column("target", sa.String(320), nullable=False),  # an email address, a Slack channel
    sa.Column("member", sa.String(200)),  # the member an email's link decides as
    # pending, sending, sent, failed, unsent (its channel not configured where the hold was stored), skipped, closed
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_at", sa.Float, nullable=False),
    sa.Column("claimed_at", sa.Float),
    sa.Column("sent_at", sa.Float),
    sa.Column("ref", sa.String(200)),  # the channel's id of what was sent (a Slack message's ts)
    sa.Column("error", sa.Text),
    sa.UniqueConstraint("hold_id", "channel", "target", name="uq_notices_target"),
)

# The bearer tokens of the MCP endpoints over HTTP (migration 0008): one per name, each for one profile and, when
# given, one agent run. Only the SHA-256 of a token is kept: what the store holds cannot be sent as a credential.
# A revoked token's row is deleted (its audit rows stay).
tokens = sa.Table(
    "tokens", metadata,
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("digest", sa.String(64), nullable=False, unique=True),  # hex SHA-256 of the token
    sa.Column("profile", sa.String(200), nullable=False),
    sa.Column("instance", sa.String(200)),  # the agent run its calls are logged and capped under; NULL: none named
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("created_by", sa.String(200), nullable=False),
    sa.Column("expires_at", sa.Float),  # NULL: never
)

# A binding that cannot start until a person sets it up (a secret, a program): one row per cause, so its owners
# are told once however many calls fail on it; its notices are in `notices`, under the alert's id (migration 0009).
alerts = sa.Table(
    "alerts", metadata,
    sa.Column("id", sa.String(40), primary_key=True),  # alert_ and a digest of the binding and the cause
    sa.Column("binding", sa.String(200), nullable=False),
    sa.Column("cause", sa.String(40), nullable=False),  # not_set_up
    sa.Column("message", sa.Text, nullable=False),  # for owners: what is missing, never a secret's value
    sa.Column("first_at", sa.Float, nullable=False),
    sa.Column("last_at", sa.Float, nullable=False),
    sa.Column("calls", sa.Integer, nullable=False),  # the calls that failed on it, counted per router's report
)
