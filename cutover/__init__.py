"""Tiered cutover workflows: l7, mesh, anycast, dns (issue 11)."""
