"""Declared regions, zones and serving clusters; observed instances."""
