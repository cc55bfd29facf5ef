"""The desired-state snapshot that gateways route by."""
