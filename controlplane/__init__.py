"""controlplane."""
