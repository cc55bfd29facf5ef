"""Lifeline: keeps LLM inference serving through failures.

This package is the top of the house: the one `lifeline` command
(`lifeline.cli`, which mounts every component's sub-commands), the demo, and
the process helpers the demo, benchmarks and tests share. Nothing below it
imports it; the shared ground floor is `common/`, the cross-process records
are `contract/`.
"""
