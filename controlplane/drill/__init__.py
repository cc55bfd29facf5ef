"""Drills: versioned fault experiments with a blast radius, stop conditions and targets, run on a cadence."""
