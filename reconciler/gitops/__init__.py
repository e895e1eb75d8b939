"""The gitops room of the control plane (design §3)."""
