"""weight_catalog."""
