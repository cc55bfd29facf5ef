"""Warm pools sized for the loss of a zone, and the regional agent that keeps them.

    capacity   the plan: serving and warm instances per zone, as a pure function with its arithmetic
    states     instance states cold → warm → serving → draining → gone, one transition table
    probe      three-level health probes and the canary; typed verdicts
    budget     how many inference probes the region may spend per second
    events     verdict changes and pool actions as contract DataPlaneEvents, shipped in the background
    driver     the pool driver interface and its `local` implementation (engine processes)
    agent      the controller loop: snapshot → observe → probe → leases → reconcile → report

Imports only `common` and `contract` (tests/unit/test_layering.py); talks to
engines, the lease registry and the control plane over HTTP and Redis.
"""
