"""The router room of the control plane (design §3)."""
