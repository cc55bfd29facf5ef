"""Cutover drivers, one module per routing system; the interface is `cutover.driver`."""
