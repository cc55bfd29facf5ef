"""The memory holder: weights (and later KV blocks) that outlive the engine process (docs/holder.md)."""
