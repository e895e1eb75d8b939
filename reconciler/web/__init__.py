"""The web room of the control plane (docs/architecture.md §3)."""
