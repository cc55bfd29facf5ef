"""KV checkpoints: the manifest, the store keys, and one store interface over three backends.

Engines write checkpoints and import them (`engine/kv_transfer.py`); the control
plane's replication copies them between regions. Both import this module and
neither imports the other, so the record and the key layout are defined once.

A checkpoint names a prefix by the hash of its last block (`contract.holder`'s
chain, rooted in the validity tuple) and holds:

    kv/<root_hash>/blocks/<block_hash>.safetensors     one block: tensor "kv", KVLayout.shape, layout.dtype
    kv/<root_hash>/manifests/<last_block_hash>.json    KVCheckpointManifest: the tuple, every block's
                                                       token ids and the sha256 of its tensor bytes

Blocks are content-addressed (the hash names the tokens and the tuple), so the
checkpoints of one long generation share every block but their newest, a copy
is idempotent, and a block is written before any manifest that names it. A
reader trusts nothing it fetched: it recomputes the chain from the token ids,
compares the tuple with its own and each tensor's sha256 with the manifest's
(`verify_manifest`, then `block_object_checksum`); anything that does not
match is refused, a miss, never a misuse (invariant 6).

Promise: cheaper semantic recovery. Nothing here changes which tokens a
continuation produces; it only decides how many positions are recomputed.

Backends (`open_kv_store`): a directory (`/path` or `file:///path`), Redis
(`redis://…?key_prefix=…`, Sentinel URLs too, via `common.redis_url`) and S3
(`s3://bucket/prefix`, boto3; `endpoint_url` for S3-compatible servers and
moto's emulator). Errors are `KVStoreUnavailable` (the store did not answer;
retry) or `KVCheckpointInvalid` (what it holds is not a valid checkpoint).
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.atomic_file import write_atomically
from contract.holder import KVValidity, kv_block_checksum, kv_block_hash, kv_root_hash

MANIFEST_FORMAT = "lifeline.kv/1"
BLOCK_TENSOR = "kv"  # the one tensor in a block object
MAX_MANIFEST_BLOCKS = 8192  # 131k positions at 16 per block: above any model this engine serves


class KVCheckpointError(Exception):
    """Base of this module's errors; carries no HTTP status (the engine maps them to its own)."""


class KVStoreUnavailable(KVCheckpointError):
    """The store did not answer (connection refused, timeout, 5xx): nothing is known, retry later."""


class KVCheckpointInvalid(KVCheckpointError):
    """What was read is not a checkpoint this reader may use: malformed, broken chain, wrong checksum."""


class TornCheckpoint(KVCheckpointInvalid):
    """A manifest names a block the store does not hold (a write or a copy cut short)."""


class KVValidityMismatch(KVCheckpointInvalid):
    """The checkpoint was made under another validity tuple: a miss for this engine, never used."""

    def __init__(self, fields: list[str]) -> None:
        super().__init__(f"validity tuple differs in {', '.join(fields) or 'an unknown field'}")
        self.fields = fields


class KVBlockEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    token_ids: list[int]
    checksum: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="kv_block_checksum of the tensor's bytes")


class KVCheckpointManifest(BaseModel):
    """The blocks of one prefix, from the root: enough to verify every byte before using it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["lifeline.kv/1"] = MANIFEST_FORMAT
    validity: KVValidity
    root_hash: str
    blocks: list[KVBlockEntry] = Field(min_length=1, max_length=MAX_MANIFEST_BLOCKS)
    # Provenance, for logs and replication; not part of what makes a block valid.
    instance_id: str | None = None
    generation: int | None = None  # the writer's (instance_id, generation): which process wrote it
    request_id: str | None = None
    created_at: float | None = None  # Unix seconds
    # The session class whose key point wrote it (contract.session.KVCheckpointRequest): replication copies
    # it only for that class's policy. None: unclassed, an engine's streaming checkpoint or a manifest from
    # before this field; every policy whose source is the store copies it. Left out of the JSON when None,
    # so an unclassed manifest is byte for byte what readers before this field accept (extra="forbid").
    session_class: str | None = Field(None, min_length=1, max_length=200)

    @property
    def last_hash(self) -> str:
        return self.blocks[-1].hash

    @property
    def token_ids(self) -> list[int]:
        return [t for block in self.blocks for t in block.token_ids]


def verify_manifest(manifest: KVCheckpointManifest, expected: KVValidity | None = None) -> None:
    """Raise KVCheckpointInvalid unless the manifest is internally consistent (and, given `expected`,
    made under that tuple): the root is the tuple's, each block holds `block_tokens` ids and its hash
    is the chain's. A differing tuple raises `KVValidityMismatch` naming the fields."""
    if expected is not None and manifest.validity != expected:
        raise KVValidityMismatch(expected.mismatches(manifest.validity))
    if manifest.root_hash != kv_root_hash(manifest.validity):
        raise KVCheckpointInvalid("root_hash is not the hash of the manifest's validity tuple")
    size = manifest.validity.layout.block_tokens
    parent = manifest.root_hash
    for index, block in enumerate(manifest.blocks):
        if len(block.token_ids) != size:
            raise KVCheckpointInvalid(f"block {index} holds {len(block.token_ids)} token ids, not {size}")
        parent = kv_block_hash(parent, block.token_ids)
        if parent != block.hash:
            raise KVCheckpointInvalid(f"block {index}'s hash is not the chain's hash of its token ids")


def parse_manifest(data: bytes) -> KVCheckpointManifest:
    try:
        return KVCheckpointManifest.model_validate_json(data)
    except ValidationError as exc:
        raise KVCheckpointInvalid(f"not a KV checkpoint manifest: {exc.errors()[0]['msg']}") from None


def block_object_checksum(data: bytes, validity: KVValidity) -> str:
    """The sha256 of a block object's tensor, after checking it holds exactly one tensor of the layout.

    numpy and safetensors only (no torch), so a replication worker can verify a copy too.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        tensors = load(data)
    except (SafetensorError, ValueError, OSError) as exc:
        raise KVCheckpointInvalid(f"block object is not safetensors: {exc}") from None
    tensor = tensors.get(BLOCK_TENSOR)
    layout = validity.layout
    if set(tensors) != {BLOCK_TENSOR} or tensor is None:
        raise KVCheckpointInvalid(f"block object must hold one tensor {BLOCK_TENSOR!r}, holds {sorted(tensors)}")
    if tuple(tensor.shape) != layout.shape or str(tensor.dtype) != layout.dtype:
        raise KVCheckpointInvalid(f"block tensor is {tensor.dtype}{list(tensor.shape)}, "
                                  f"the layout says {layout.dtype}{list(layout.shape)}")
    return kv_block_checksum(memoryview(tensor).cast("B"))


def block_key(root_hash: str, block_hash: str) -> str:
    return f"kv/{root_hash}/blocks/{block_hash}.safetensors"


def manifest_key(root_hash: str, last_hash: str) -> str:
    return f"kv/{root_hash}/manifests/{last_hash}.json"


# -- the store interface -----------------------------------------------------------------------


class KVStore(Protocol):
    """Bytes under keys (`a/b/c.ext`). Every method raises KVStoreUnavailable when the store does not answer."""

    location: str  # for logs; never holds a password

    def put(self, key: str, data: bytes) -> None:
        """Write the whole object, so a reader sees the old bytes or the new, never a part."""
        ...

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if there is none."""
        ...

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """For each key, whether an object is stored under it (one round trip where the backend allows)."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with `prefix`, sorted."""
        ...

    def versions(self, prefix: str) -> dict[str, str]:
        """Every key under `prefix` with a token that changes whenever its object is replaced: how a scan
        of mutable objects (session records) tells which changed without reading them. From the listing's
        own metadata where the backend has it (a file's mtime, size and inode; S3's ETag); Redis keeps none,
        so there it is the value's SHA-1, computed by the server (one script call per 500 keys)."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object if present."""
        ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid store key {key!r}")
    return key


class FilesystemKVStore:
    """A directory; each object a file written atomically (common.atomic_file)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, key: str, data: bytes) -> None:
        try:
            write_atomically(self._path(key), data)
        except OSError as exc:
            raise KVStoreUnavailable(f"{self.location}: {exc}") from exc

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KVStoreUnavailable(f"{self.location}: {exc}") from exc

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return [self._path(key).is_file() for key in keys]

    def list(self, prefix: str) -> list[str]:
        if not self.root.is_dir():
            return []
        found = []
        for directory, _, files in os.walk(self.root):
            for name in files:
                if name.startswith("."):  # a write in progress (common.atomic_file's temporary)
                    continue
                key = Path(directory, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append(key)
        return sorted(found)

    def versions(self, prefix: str) -> dict[str, str]:
        found = {}
        for key in self.list(prefix):
            try:
                stat = self._path(key).stat()
            except FileNotFoundError:
                continue  # deleted since the walk
            except OSError as exc:
                raise KVStoreUnavailable(f"{self.location}: {exc}") from exc
            found[key] = f"{stat.st_mtime_ns}:{stat.st_size}:{stat.st_ino}"  # a write renames a new file in
        return found

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class RedisKVStore:
    """One Redis string per object under `key_prefix`. SET replaces a value whole."""

    def __init__(self, client: Any, key_prefix: str, location: str) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.location = location

    def _call(self, method: str, *args: Any) -> Any:
        import redis

        try:
            return getattr(self.client, method)(*args)
        except redis.RedisError as exc:
            raise KVStoreUnavailable(f"{self.location}: {type(exc).__name__}: {exc}") from exc

    def put(self, key: str, data: bytes) -> None:
        self._call("set", self.key_prefix + _check_key(key), data)

    def get(self, key: str) -> bytes | None:
        return self._call("get", self.key_prefix + _check_key(key))

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        import redis

        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(self.key_prefix + _check_key(key))
            return [bool(n) for n in pipe.execute()]
        except redis.RedisError as exc:
            raise KVStoreUnavailable(f"{self.location}: {type(exc).__name__}: {exc}") from exc

    def list(self, prefix: str) -> list[str]:
        import redis

        pattern = self.key_prefix + prefix.replace("*", r"\*").replace("?", r"\?").replace("[", r"\[") + "*"
        try:
            keys = [k.decode() if isinstance(k, bytes) else k for k in self.client.scan_iter(match=pattern, count=500)]
        except redis.RedisError as exc:
            raise KVStoreUnavailable(f"{self.location}: {type(exc).__name__}: {exc}") from exc
        return sorted(k[len(self.key_prefix):] for k in keys)

    def versions(self, prefix: str) -> dict[str, str]:
        keys = self.list(prefix)
        found = {}
        for start in range(0, len(keys), _REDIS_VERSION_BATCH):
            batch = keys[start:start + _REDIS_VERSION_BATCH]
            digests = self._call("eval", _REDIS_SHA1_SCRIPT, len(batch), *(self.key_prefix + k for k in batch))
            for key, digest in zip(batch, digests, strict=True):
                if digest:  # deleted since the scan: nothing
                    found[key] = digest.decode() if isinstance(digest, bytes) else digest
        return found

    def delete(self, key: str) -> None:
        self._call("delete", self.key_prefix + _check_key(key))


_REDIS_VERSION_BATCH = 500
_REDIS_SHA1_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  out[i] = value and redis.sha1hex(value) or false
end
return out
"""


class S3KVStore:
    """Objects under `s3://bucket/prefix/` (boto3). A PUT replaces an object whole."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.location = f"s3://{bucket}/{self.prefix}"

    def _call(self, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, method)(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise KVStoreUnavailable(f"{self.location}: S3 said {code or exc}") from exc
        except BotoCoreError as exc:
            raise KVStoreUnavailable(f"{self.location}: {exc}") from exc

    def put(self, key: str, data: bytes) -> None:
        self._call("put_object", Key=self.prefix + _check_key(key), Body=data)

    def get(self, key: str) -> bytes | None:
        response = self._call("get_object", Key=self.prefix + _check_key(key))
        if response is None:
            return None
        from botocore.exceptions import BotoCoreError

        try:
            return response["Body"].read()
        except BotoCoreError as exc:
            raise KVStoreUnavailable(f"{self.location}: {exc}") from exc

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return [self._call("head_object", Key=self.prefix + _check_key(key)) is not None for key in keys]

    def list(self, prefix: str) -> list[str]:
        return list(self.versions(prefix))  # the listing's ETags come free with it

    def versions(self, prefix: str) -> dict[str, str]:
        found: dict[str, str] = {}
        token = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": self.prefix + prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("list_objects_v2", **kwargs) or {}
            found.update((item["Key"][len(self.prefix):], f"{item.get('ETag', '')}:{item.get('Size', 0)}")
                         for item in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return dict(sorted(found.items()))
            token = page.get("NextContinuationToken")

    def delete(self, key: str) -> None:
        self._call("delete_object", Key=self.prefix + _check_key(key))


_MEMORY_STORES = itertools.count(1)


class MemoryKVStore:
    """A dict in this process: the embedded default where one process is the only reader and writer."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.location = f"memory:{next(_MEMORY_STORES)}"  # one per store: scans cache what they read by it

    def put(self, key: str, data: bytes) -> None:
        self.objects[_check_key(key)] = bytes(data)

    def get(self, key: str) -> bytes | None:
        return self.objects.get(_check_key(key))

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return [_check_key(key) in self.objects for key in keys]

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def versions(self, prefix: str) -> dict[str, str]:
        return {k: hashlib.sha1(self.objects[k]).hexdigest() for k in self.list(prefix)}  # noqa: S324 - not security

    def delete(self, key: str) -> None:
        self.objects.pop(_check_key(key), None)


STORE_SCHEMES = ("s3", "redis", "rediss", "redis+sentinel", "file")


def check_kv_store_url(url: str) -> str:
    """`url` if it names a store `open_kv_store` can open; ValueError saying what is wrong (for settings)."""
    parts = urlsplit(url)
    if parts.scheme and parts.scheme not in STORE_SCHEMES:
        raise ValueError(f"{url!r}: a KV store is s3://, redis://, redis+sentinel://, file:// or a path")
    if parts.scheme == "s3" and not parts.netloc:
        raise ValueError(f"{url!r}: name a bucket (s3://bucket/prefix)")
    if parts.scheme.startswith("redis"):
        from common.redis_url import parse_redis_url

        parse_redis_url(url)
    if not url.strip():
        raise ValueError("name a store")
    return url


def redact_kv_store_url(url: str) -> str:
    """The URL with any password replaced by `***` (user names and query kept): safe to log or echo back.

    Redis URLs carry a password (`redis://:secret@host`); S3 credentials come from the environment and a
    path has none. Any URL's userinfo is masked all the same (an operator may paste one into the wrong
    scheme), and so is a query option that names a password (`password=…`, `sentinel_password=…`).
    """
    parts = urlsplit(url)
    if not parts.scheme:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hosts}" if ":" in userinfo else f"***@{hosts}"
    query = "&".join(f"{k}=***" if "password" in k.lower() else f"{k}={v}" for k, v in parse_qsl(parts.query))
    return parts._replace(netloc=netloc, query=query).geturl()


def open_kv_store(url: str, *, s3_endpoint_url: str | None = None) -> KVStore:
    """The store a URL names: `s3://bucket/prefix`, `redis://…`/`redis+sentinel://…` (`key_prefix` in the
    query, default `lifeline:kv:`), `file:///path` or a plain path. ValueError naming what is wrong."""
    parts = urlsplit(check_kv_store_url(url))
    if parts.scheme == "s3":
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=s3_endpoint_url,
                              config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 2}))
        return S3KVStore(client, parts.netloc, parts.path)
    if parts.scheme in ("redis", "rediss", "redis+sentinel"):
        from common.redis_url import redis_client

        query = parse_qsl(parts.query)
        prefix = dict(query).get("key_prefix", "lifeline:kv:")
        rest = "&".join(f"{k}={v}" for k, v in query if k != "key_prefix")
        client = redis_client(parts._replace(query=rest).geturl(), decode_responses=False)
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return RedisKVStore(client, prefix, f"{parts.scheme}://{netloc}{parts.path} ({prefix})")
    if parts.scheme == "file":
        return FilesystemKVStore(Path(parts.path))
    return FilesystemKVStore(Path(url))


# -- checkpoints over a store ------------------------------------------------------------------


class KVCheckpointStore:
    """Checkpoint-level reads and writes over any KVStore: what engines and replication share."""

    def __init__(self, store: KVStore) -> None:
        self.store = store

    def missing_blocks(self, root_hash: str, hashes: Sequence[str]) -> list[str]:
        present = self.store.exists([block_key(root_hash, h) for h in hashes])
        return [h for h, there in zip(hashes, present, strict=True) if not there]

    def write_block(self, root_hash: str, block_hash: str, data: bytes) -> None:
        self.store.put(block_key(root_hash, block_hash), data)

    def write_manifest(self, manifest: KVCheckpointManifest) -> None:
        """Write after every block it names: a reader that finds a manifest finds its blocks."""
        unclassed = {"session_class"} if manifest.session_class is None else None  # readable by older readers
        self.store.put(manifest_key(manifest.root_hash, manifest.last_hash),
                       manifest.model_dump_json(exclude=unclassed).encode())

    def longest_manifest(self, root_hash: str, hashes: Sequence[str]) -> str | None:
        """The last hash of the longest prefix in `hashes` (chain order) that has a manifest."""
        present = self.store.exists([manifest_key(root_hash, h) for h in hashes])
        return next((h for h, there in zip(reversed(hashes), reversed(present), strict=True) if there), None)

    def read_manifest(self, root_hash: str, last_hash: str) -> KVCheckpointManifest | None:
        data = self.store.get(manifest_key(root_hash, last_hash))
        if data is None:
            return None
        manifest = parse_manifest(data)
        if manifest.root_hash != root_hash or manifest.last_hash != last_hash:
            raise KVCheckpointInvalid("the manifest names another prefix than its key")
        return manifest

    def read_block(self, root_hash: str, block_hash: str) -> bytes | None:
        return self.store.get(block_key(root_hash, block_hash))

    def read_verified_blocks(self, manifest: KVCheckpointManifest, validity: KVValidity, *,
                             start: int = 0) -> list[bytes]:
        """The objects of the manifest's blocks from `start` on, once the manifest holds under `validity` and
        each object's sha256 is the manifest's: what an engine loads (either kind). TornCheckpoint for a block
        the store lacks; KVValidityMismatch or KVCheckpointInvalid for anything else."""
        verify_manifest(manifest, validity)
        objects = []
        for entry in manifest.blocks[start:]:
            data = self.read_block(manifest.root_hash, entry.hash)
            if data is None:
                raise TornCheckpoint(f"block {entry.hash[:12]}… named by the manifest is not in the store")
            if block_object_checksum(data, validity) != entry.checksum:
                raise KVCheckpointInvalid(f"block {entry.hash[:12]}…'s sha256 does not match the manifest")
            objects.append(data)
        return objects

    def manifests(self, root_hash: str | None = None) -> list[str]:
        """Keys of every manifest (under one root, or all): what a replication sweep walks."""
        keys = self.store.list(f"kv/{root_hash}/manifests/" if root_hash else "kv/")
        return [k for k in keys if "/manifests/" in k and k.endswith(".json")]

    def manifest_at(self, key: str) -> KVCheckpointManifest | None:
        """The manifest stored under a manifest key (`kv/<root>/manifests/<hash>.json`), or None."""
        root_hash, last_hash = split_manifest_key(key)
        return self.read_manifest(root_hash, last_hash)

    def manifests_older_than(self, cutoff: float) -> list[str]:
        """Keys of the manifests whose `created_at` (Unix seconds) is before `cutoff`: what retention deletes.

        Age is the manifest's own `created_at`, not the object's write time, so a checkpoint replicated
        late is as old at the destination as at the source, and Redis (no write time) answers the same as
        a directory or S3. A manifest with no `created_at`, or one that does not parse, is never aged out:
        retention deletes only what it can date.
        """
        old = []
        for key in self.manifests():
            try:
                manifest = self.manifest_at(key)
            except KVCheckpointInvalid:
                continue
            if manifest is not None and manifest.created_at is not None and manifest.created_at < cutoff:
                old.append(key)
        return old

    def delete_checkpoint(self, key: str, *, keep_blocks: set[str] | frozenset[str] = frozenset()) -> int:
        """Delete a manifest, then those of its blocks no kept manifest names; blocks deleted.

        The manifest goes first (the reverse of a write), so a reader never finds a manifest naming a
        deleted block. Blocks are shared between the checkpoints of one stream, so the caller passes
        `keep_blocks`, the hashes named by every manifest that stays (`block_hashes`).
        """
        root_hash, _ = split_manifest_key(key)
        try:
            manifest = self.manifest_at(key)
        except KVCheckpointInvalid:
            manifest = None
        self.store.delete(key)
        if manifest is None:
            return 0
        deleted = 0
        for entry in manifest.blocks:
            if entry.hash not in keep_blocks:
                self.store.delete(block_key(root_hash, entry.hash))
                deleted += 1
        return deleted

    def block_hashes(self, keys: Sequence[str]) -> set[str]:
        """Every block hash the manifests under `keys` name (unparsable ones name none)."""
        hashes: set[str] = set()
        for key in keys:
            try:
                manifest = self.manifest_at(key)
            except KVCheckpointInvalid:
                continue
            if manifest is not None:
                hashes.update(entry.hash for entry in manifest.blocks)
        return hashes


def split_manifest_key(key: str) -> tuple[str, str]:
    """`kv/<root>/manifests/<last hash>.json` → (root hash, last hash); ValueError for any other key."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != "kv" or parts[2] != "manifests" or not parts[3].endswith(".json"):
        raise ValueError(f"{key!r} is not a manifest key (kv/<root>/manifests/<hash>.json)")
    return parts[1], parts[3].removesuffix(".json")


def copy_checkpoint(source: KVCheckpointStore, target: KVCheckpointStore, key: str) -> int:
    """Copy one checkpoint (its blocks, then its manifest) and verify it on both sides; blocks copied.

    Idempotent: a block the target already holds with the manifest's sha256 is not copied again, and
    the manifest goes last, so a copy cut short leaves no manifest naming a missing block. A source
    block that does not match its manifest raises KVCheckpointInvalid (never copied); a target that
    reads back other bytes raises it too. For the control plane's replication (issue 12).
    """
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != "kv" or parts[2] != "manifests" or not parts[3].endswith(".json"):
        raise ValueError(f"{key!r} is not a manifest key (kv/<root>/manifests/<hash>.json)")
    root_hash = parts[1]
    manifest = source.read_manifest(root_hash, parts[3].removesuffix(".json"))
    if manifest is None:
        raise KVCheckpointInvalid(f"{key} is not in {source.store.location}")
    verify_manifest(manifest)
    copied = 0
    for entry in manifest.blocks:
        held = target.read_block(root_hash, entry.hash)
        if held is not None and _checksum_or_none(held, manifest.validity) == entry.checksum:
            continue
        data = source.read_block(root_hash, entry.hash)
        if data is None or block_object_checksum(data, manifest.validity) != entry.checksum:
            raise KVCheckpointInvalid(f"block {entry.hash[:12]}… in {source.store.location} does not match the manifest")
        target.write_block(root_hash, entry.hash, data)
        written = target.read_block(root_hash, entry.hash)
        if written is None or block_object_checksum(written, manifest.validity) != entry.checksum:
            raise KVCheckpointInvalid(f"block {entry.hash[:12]}… read back from {target.store.location} differs")
        copied += 1
    target.write_manifest(manifest)
    return copied


def _checksum_or_none(data: bytes, validity: KVValidity) -> str | None:
    try:
        return block_object_checksum(data, validity)
    except KVCheckpointInvalid:
        return None
