"""The web room of the control plane (design §3)."""
