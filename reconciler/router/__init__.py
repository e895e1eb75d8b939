"""The router room of the control plane (docs/architecture.md §3)."""
