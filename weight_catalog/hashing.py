"""The catalog's shard hashing: `common.hashing`, re-exported.

It lives in `common` so the regional agent (which may import only `common` and
`contract`) checks a cold pool's staged shards with the same code the catalog
registered them with; one hashing helper, not two.
"""

from common.hashing import DEFAULT_BLOCK_BYTES, Progress, ShardDigest, ShardSource, hash_shards, sha256_stream

__all__ = ["DEFAULT_BLOCK_BYTES", "Progress", "ShardDigest", "ShardSource", "hash_shards", "sha256_stream"]
