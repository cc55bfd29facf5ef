"""The append-only event log: alias moves, topology changes, cutover steps."""
