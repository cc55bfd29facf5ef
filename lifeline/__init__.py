"""Lifeline: keeps LLM inference serving through failures.

This package holds only what every process shares: the `lifeline` command
line and structured logging. Each component lives in its own top-level
package (engine, gateway, controlplane, weight_catalog, ...).
"""
