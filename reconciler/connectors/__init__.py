"""The connectors room of the control plane (design §3)."""
