"""Governance: the decision, holds, spend and the store (design §7)."""
