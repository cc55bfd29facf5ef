"""Every cutover tier's driver, one module each, behind one protocol (`cutover.drivers.base`, which maps them)."""
