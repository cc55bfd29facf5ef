"""API tokens, roles and the audit trail of mutating calls."""
