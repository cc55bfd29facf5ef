"""KV replication policies and the Celery replication that follows them (issue 12, docs/kv_checkpoints.md)."""
