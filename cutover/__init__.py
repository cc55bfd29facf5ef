"""Tiered cutover workflows: plan → execute → verify → complete | roll back, and zonal shifts.

A cutover moves routing for one scope (an instance, a zone, a region) at one
tier (l7, mesh, anycast, dns) and records, per step, the state it found, what
it changed, how it verified and the outcome, as one event each. See
docs/cutover.md.
"""
