"""The connectors room of the control plane (docs/architecture.md §3)."""
